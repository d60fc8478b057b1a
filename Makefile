# The two commands: `make run` starts the whole platform, `make test` runs the whole suite.
# Both install what is missing first (a .venv from requirements*.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DJANGO_SETTINGS_MODULE ?= taskplatform.settings.base

.PHONY: run test lint bench clean

$(BIN)/.installed-run: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(BIN)/.installed-dev: requirements.txt requirements-dev.txt $(BIN)/.installed-run
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

# axe-core for the browser tests' accessibility scans (tests/browser/package-lock.json), when npm is
# there; without it those scans are skipped, saying so.
AXE := tests/browser/node_modules/axe-core/axe.min.js
$(AXE): tests/browser/package.json tests/browser/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) && touch $@; \
	else echo "npm not found: the accessibility scans (tests/browser) will be skipped"; fi

run: $(BIN)/.installed-run
	$(BIN)/python -m devtools.supervisor

test: $(BIN)/.installed-dev $(AXE)
	DJANGO_SETTINGS_MODULE=taskplatform.settings.test $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .

bench: $(BIN)/.installed-dev
	$(BIN)/python bench/throughput.py

clean:
	rm -rf var/test.sqlite3* .pytest_cache
