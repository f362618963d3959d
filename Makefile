# make demo: set up .venv and run the main job on a local cluster
# make test: set up .venv with the dev extras and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/paramserver demo

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python -m pip install --quiet -e ".[bench]" && $(BIN)/python bench/pushpull.py && $(BIN)/python bench/train.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
