# Two entry points: `make demo` (the main job on bundled defaults) and `make test` (the whole suite).
# Both build their own virtual environment, so they work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_REPORT ?= reports/demo

.PHONY: demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,torch]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/slimpack compare --report $(DEMO_REPORT)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) reports .pytest_cache
