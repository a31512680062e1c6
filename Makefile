# The two commands a newcomer needs:  make workshop   (run the course)   make test   (pass the tests)
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: setup browser workshop tour test test-fast lint clean

setup:
	@bash scripts/setup.sh

## Open the course index (src/infer_lab/notebooks/index.py) in the browser, served by marimo from that folder;
## a notebook's kernel stops a few seconds after its tab closes (scripts/workshop.py).
workshop: setup
	$(PY) scripts/workshop.py

## Run every module headless and write tour-report/report.md (the instructor's pre-run).
tour: setup
	$(BIN)/infer-lab tour --quick --out tour-report

## Debian's chromium for the browser test (tests/test_browser.py), installed when missing and
## this is root on a machine with apt-get; elsewhere that test skips (it fails under CI=true).
browser: setup
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "test: installing chromium (apt-get, log in $(VENV)/chromium-install.log)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium fonts-liberation; } >$(VENV)/chromium-install.log 2>&1 \
	  || echo "test: could not install chromium (see $(VENV)/chromium-install.log)"; \
	fi

## Run the test suite (this is what CI runs).
test: setup browser
	$(PY) -m pytest -q

## The fast loop for developers: everything but the notebooks, the browser and long measurements.
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check src tests

clean:
	rm -rf $(VENV) tour-report .pytest_cache
