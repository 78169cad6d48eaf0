# Two-command quickstart: `make demo` (main job) and `make test` (test suite).
# Before a commit: `make check test` (ruff lint + format check, mypy on src/, then the tests).
# Each target creates .venv and installs what it needs; torch is pinned to the CPU wheel.
# `make demo` passes --resume: a second `make demo` re-uses the finished run in runs/demo (no
# retraining) and re-renders its report; an interrupted one continues from its last checkpoint.
# To train the demo afresh: `make clean demo`.
# `make clean` removes runs/; `make distclean` also removes .venv (the next target reinstalls it).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check format install clean distclean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,tracking,wandb,formats,privacy,simulation]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedseg run --preset demo --out runs/demo --resume

test: $(STAMP)
	$(BIN)/python -m pytest

check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

clean:
	rm -rf runs

distclean: clean
	rm -rf $(VENV)
