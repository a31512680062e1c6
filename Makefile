# The two commands a newcomer needs:  make workshop   (run the course)   make test   (pass the tests)
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: setup workshop tour test test-fast lint clean

setup:
	@bash scripts/setup.sh

## Open the marimo notebooks in the browser (uses the GPU when there is one, else the CPU).
workshop: setup
	$(BIN)/marimo edit notebooks/

## Run every module headless and write tour-report/report.md (the instructor's pre-run).
tour: setup
	$(BIN)/infer-lab tour --quick --out tour-report

## Run the test suite (this is what CI runs).
test: setup
	$(PY) -m pytest -q

## The fast loop for developers: everything but the notebooks, the browser and long measurements.
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check src tests notebooks

clean:
	rm -rf $(VENV) tour-report .pytest_cache
