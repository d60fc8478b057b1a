# The two commands: `make run` starts the whole platform, `make test` runs the whole suite.
# Both install what is missing first (a .venv from requirements*.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Every entry point (manage.py, the ASGI application, the Celery app) defaults to the production
# settings; `make run` and `make test` opt into development and test explicitly.

.PHONY: run test lint bench deploy-check clean

$(BIN)/.installed-run: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(BIN)/.installed-dev: requirements.txt requirements-dev.txt $(BIN)/.installed-run
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

run: $(BIN)/.installed-run
	DJANGO_SETTINGS_MODULE=taskplatform.settings.development $(BIN)/python -m taskplatform.supervisor

test: $(BIN)/.installed-dev
	DJANGO_SETTINGS_MODULE=taskplatform.settings.test $(BIN)/python -m pytest $(PYTEST_ARGS)

# Django's deployment checklist under the production settings, as CI runs it. The key is a
# throwaway: the check judges a key's strength, never its secrecy.
deploy-check: $(BIN)/.installed-run
	DJANGO_SETTINGS_MODULE=taskplatform.settings.production \
	DJANGO_SECRET_KEY="$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
	$(BIN)/python manage.py check --deploy --fail-level WARNING

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .

bench: $(BIN)/.installed-dev
	DJANGO_SETTINGS_MODULE=taskplatform.settings.development $(BIN)/python bench/throughput.py

clean:
	rm -rf var/test.sqlite3* .pytest_cache
