# Two-command quickstart: `make demo` (main job) and `make test` (test suite).
# Each target creates .venv and installs what it needs; torch is pinned to the CPU wheel.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedseg run --preset demo --out runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs
