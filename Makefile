# `make demo` and `make test` each set up everything on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build; a newer or unpinned torch would pull gigabytes of CUDA wheels.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install "$(TORCH)"
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/rosetta run -f examples/quickstart.yaml --output runs/quickstart

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not slow"

clean:
	rm -rf $(VENV) runs build *.egg-info
