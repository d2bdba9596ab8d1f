# The two commands of the README, plus a few conveniences.
#   make book   build the Jupyter Book (strict) and print where index.html is
#   make test   lint, unit/property tests, strict nbval of every notebook (twice: the second
#               time under a BLAS setting that rounds differently), strict book build, and
#               the built book checked in headless Chromium (skipped, saying so, without it)
# Both create .venv on first use (Python 3.11+ and make are all a fresh machine needs).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NBVAL  := --nbval --nbval-sanitize-with notebooks/sanitize.cfg --nbval-current-env
# Debian's Chromium, driven by Playwright (which never downloads a browser of its own here).
CHROMIUM ?= /usr/bin/chromium

.PHONY: book test lint unit notebooks notebooks-other-blas browser test-gpu bench-cpu bench-gpu clean venv

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing the book's packages into $(VENV) (pinned by constraints.txt; a few minutes the first time)"
	$(BIN)/python -m pip install --quiet -c constraints.txt pip
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt -r requirements.txt -e .
	@touch $(STAMP)

venv: $(STAMP)

# --all: every page is rebuilt, so a warning cannot hide in a page left from an earlier
# run, and a changed stylesheet reaches _build/html even when no page changed.
book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going --all
	@echo "The book is at: file://$(CURDIR)/_build/html/index.html"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

unit: $(STAMP)
	$(BIN)/python -m pytest tests/

notebooks: $(STAMP)
	$(BIN)/python -m pytest $(NBVAL) notebooks/

# Every page of _build/html in headless Chromium (bookcheck/); screenshots go to
# _build/screenshots/. Without Chromium it is skipped, and the line below says so.
browser: book
	@if [ -x "$(CHROMIUM)" ]; then \
		CHROMIUM="$(CHROMIUM)" $(BIN)/python -m pytest bookcheck/; \
	else \
		echo "SKIPPED browser check: no Chromium at $(CHROMIUM)."; \
		echo "  Install it (Debian/Ubuntu, as root): apt-get install chromium"; \
	fi


# Rounding-level digits change with the CPU, the BLAS kernel and the thread count, so a
# committed output must not contain any: every reader's machine has to print it exactly.
# This runs the notebooks again under a BLAS setting that rounds differently from the
# default (on x86-64: OpenBLAS's kernels for Prescott, an early SSE3 CPU, on one thread),
# so an output that depends on the machine fails here, the day it is committed. NumPy's
# OpenBLAS reads these variables when it loads; another BLAS ignores them.
ifeq ($(shell uname -m),x86_64)
OTHER_BLAS ?= OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=1
else
OTHER_BLAS ?= OPENBLAS_NUM_THREADS=1
endif

notebooks-other-blas: $(STAMP)
	env $(OTHER_BLAS) $(BIN)/python -m pytest $(NBVAL) notebooks/

test: lint unit notebooks notebooks-other-blas book browser
	@echo "make test: all passed"

# On a machine with an NVIDIA GPU: installs CuPy for your driver's CUDA major version into
# .venv (CUDA=12 or CUDA=13; `nvidia-smi` prints it), then runs the GPU tests, the nvcc
# compile checks, strict nbval of every chapter (here the cells tagged gpu run too: those of
# chapters 7 to 11 and of the appendices of 5 and 8), and the GPU benchmark, which rewrites
# results/gpu_bench.json (the chapters' tables and plots read it).
CUDA ?= 12
test-gpu: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[cuda$(CUDA)]'
	$(BIN)/python -m pytest -m "gpu or nvcc" tests/
	$(BIN)/python -m pytest $(NBVAL) notebooks/
	$(BIN)/python -m flashref.bench gpu

bench-cpu: $(STAMP)
	$(BIN)/python -m flashref.bench cpu

bench-gpu: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[cuda$(CUDA)]'
	$(BIN)/python -m flashref.bench gpu

clean:
	rm -rf _build .pytest_cache .ruff_cache .hypothesis
