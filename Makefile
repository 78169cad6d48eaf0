# Two-command quickstart: `make demo` (main job) and `make test` (test suite).
# Before a commit: `make check test` (ruff lint + format check, mypy on src/, then the tests).
# `make docs`: the documentation site (mkdocs build --strict, warnings are errors) -> build/site/index.html.
# Each target creates .venv and installs what it needs; torch is pinned to the CPU wheel.
# `make demo` passes --resume: a second `make demo` re-uses the finished run in runs/demo (no
# retraining) and re-renders its report; an interrupted one continues from its last checkpoint.
# To train the demo afresh: `make clean demo`.
# `make clean` removes runs/; `make distclean` also removes .venv (the next target reinstalls it).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch's CPU wheel: on Linux, PyPI's torch 2.13.0 is the multi-GB CUDA build. Where pytorch.org's CPU index answers,
# pip also looks there and takes its 2.13.0+cpu (a local version sorts above 2.13.0); where it does not (an offline
# mirror that holds the CPU wheel, as on this project's CI), the plain pin. Checked when a recipe needs it.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX = $(shell $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" \
  2>/dev/null && echo --extra-index-url $(TORCH_CPU_INDEX))

.PHONY: demo test check docs format install dist-check clean distclean

$(STAMP): pyproject.toml
	@echo "installing fedseg and its dependencies into $(VENV) (2-4 minutes the first time; pip prints nothing meanwhile)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 $(TORCH_INDEX)
	$(BIN)/pip install -q -e '.[test,tracking,wandb,formats,privacy,simulation]'
	touch $(STAMP)

# fedseg's modules compiled to bytecode, as pip does for a wheel: an editable install imports src/, and where
# PYTHONDONTWRITEBYTECODE is set every process (the command, each pool worker's server, each test subprocess)
# would compile them anew, ~0.2 s each. Incremental: only changed files are compiled again.
BYTECODE := $(BIN)/python -m compileall -q src

install: $(STAMP)
	@$(BYTECODE)

demo: $(STAMP)
	@$(BYTECODE)
	$(BIN)/fedseg run --preset demo --out runs/demo --resume

# The suite in three processes on 2 cores (pytest-xdist; more in one: `$(BIN)/python -m pytest`): about half its time
# is real Flower deployments, which wait on one another's polls more than they compute (a `flower local` of 9 methods
# kept 35% of 2 cores busy), so a third process fills the cores: 21 min 3 s against 24 min 4 s in two (2,143 tests at
# 966bd5c, one run each on one machine; 26 min in two in that commit's CI); 21 min 44 s and 27 min 43 s in the
# two CIs of 82938d2 and its parent: the machine's noise is as large as the gain. --dist loadscope keeps a module's tests (and its module-scoped fixtures: trained runs, Flower deployments) in one
# process. Two timing bugs this load exposed are fixed (a Flower node asked twice; a Ray actor outliving its command).
# --durations lists the 30 slowest tests at the end: where the suite's time goes, for keeping it near 20 min.
test: $(STAMP)
	@$(BYTECODE)
	$(BIN)/python -m pytest -n 3 --dist loadscope --durations=30

check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs/gen_methods.py docs/gen_results.py
	$(BIN)/ruff format --check src tests benchmarks docs/gen_methods.py docs/gen_results.py
	$(BIN)/mypy

# The package as users get it: `python -m build` makes the sdist, then the wheel from the sdist (so a file missing
# from the sdist fails here); a clean venv takes torch's CPU wheel, then the wheel, and its `fedseg` trains one demo
# round outside the checkout; then the sdist is installed over it and checked the same way.
DIST_VENV := build/dist-venv
dist-check: $(STAMP)
	rm -rf dist build
	$(BIN)/python -m build -q -o dist . > /dev/null
	$(PY) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install -q --upgrade pip
	$(DIST_VENV)/bin/pip install -q torch==2.13.0 $(TORCH_INDEX)
	$(DIST_VENV)/bin/pip install -q dist/fedseg-*.whl
	cd build && ../$(DIST_VENV)/bin/fedseg --version && ../$(DIST_VENV)/bin/fedseg run --preset demo \
	  --algorithms fedavg --rounds 1 --set data.scale=0.1 --out wheel-run > /dev/null && test -s wheel-run/summary.json
	$(DIST_VENV)/bin/pip install -q --force-reinstall --no-deps dist/fedseg-*.tar.gz
	cd build && ../$(DIST_VENV)/bin/fedseg presets > /dev/null && ../$(DIST_VENV)/bin/python -c \
	  "import fedseg.presets, importlib.resources as r; assert r.files('fedseg.presets').joinpath('demo.yaml').is_file()"
	@echo "dist-check: wheel and sdist install and run in a clean venv"

# The docs extra goes into the same .venv, behind its own stamp (the main install does not need MkDocs).
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict -d build/site

format: $(STAMP)
	$(BIN)/ruff check --fix src tests benchmarks docs/gen_methods.py docs/gen_results.py
	$(BIN)/ruff format src tests benchmarks docs/gen_methods.py docs/gen_results.py

clean:
	rm -rf runs

distclean: clean
	rm -rf $(VENV)
