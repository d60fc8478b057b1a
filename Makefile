# The two commands: `make run` starts the whole platform, `make test` runs the whole suite.
# Both install what is missing first (a .venv from requirements*.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Every entry point (manage.py, the ASGI application, the Celery app) defaults to the production
# settings; `make run` and `make test` opt into development and test explicitly.

PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
# How requirements.lock is written: every package production needs, with the hashes of its files.
LOCK_COMMAND := pip-compile --allow-unsafe --generate-hashes --no-emit-find-links --no-emit-index-url \
	--strip-extras --output-file=requirements.lock requirements.txt

.PHONY: run test lint bench deploy-check lock audit clean

# Production's exact packages first (hash-checked, as the Docker image installs them), then the
# development extras (requirements-run.txt) and the test tools (requirements-dev.txt).
$(BIN)/.installed-run: requirements.txt requirements.lock requirements-run.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --require-hashes --no-deps -r requirements.lock
	$(PIP) -r requirements-run.txt
	touch $@

$(BIN)/.installed-dev: requirements-dev.txt $(BIN)/.installed-run
	$(PIP) -r requirements-dev.txt
	touch $@

$(BIN)/.installed-tools: requirements-tools.txt $(BIN)/.installed-run
	$(PIP) -r requirements-tools.txt
	touch $@

# axe-core for the browser tests' accessibility scans (tests/browser/package-lock.json), when npm is
# there; without it those scans are skipped, saying so.
AXE := tests/browser/node_modules/axe-core/axe.min.js
$(AXE): tests/browser/package.json tests/browser/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) && touch $@ \
	    || echo "npm ci failed in tests/browser: the accessibility scans will be skipped"; \
	else echo "npm not found: the accessibility scans (tests/browser) will be skipped"; fi

run: $(BIN)/.installed-run
	# exec: the supervisor takes the shell's place, so the SIGTERM or Ctrl-C that make passes on reaches it.
	DJANGO_SETTINGS_MODULE=taskplatform.settings.development exec $(BIN)/python -m devtools.supervisor

test: $(BIN)/.installed-dev $(AXE)
	DJANGO_SETTINGS_MODULE=taskplatform.settings.test $(BIN)/python -m pytest $(PYTEST_ARGS)

# Django's deployment checklist under the production settings, as CI runs it. The key is a
# throwaway: the check judges a key's strength, never its secrecy.
deploy-check: $(BIN)/.installed-run
	DJANGO_SETTINGS_MODULE=taskplatform.settings.production \
	DJANGO_SECRET_KEY="$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
	$(BIN)/python manage.py check --deploy --fail-level WARNING

# Rewrite requirements.lock after a change to requirements.txt (asks the package index).
lock: $(BIN)/.installed-tools
	$(BIN)/$(LOCK_COMMAND)

# Known vulnerabilities in the packages production installs. Asks a vulnerability database (the
# package index's JSON API): run it where one is reachable; CI here has none, so CI does not run it.
audit: $(BIN)/.installed-tools
	$(BIN)/pip-audit --disable-pip --require-hashes -r requirements.lock

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .

bench: $(BIN)/.installed-dev
	DJANGO_SETTINGS_MODULE=taskplatform.settings.development $(BIN)/python bench/throughput.py

clean:
	rm -rf var/test.sqlite3* .pytest_cache
