# One image for every process of the platform; docker-compose.yml picks the command:
#   web     uvicorn taskplatform.asgi:application --host 0.0.0.0 --port 8000 (the default below)
#   worker  celery -A taskplatform worker -l INFO
#   beat    celery -A taskplatform beat -l INFO
#   flower  celery -A taskplatform flower
# Settings come from the environment (see .env.example); DJANGO_SECRET_KEY is required.

# --- the source, without what a developer's checkout also holds --------------------------------
FROM python:3.11-slim AS source
WORKDIR /src
COPY . .
# A local virtualenv, the SQLite database, Redis data, a developer's .env and the development tools
# (devtools: the make-run supervisor, the embedded Redis) must not end up in
# the image (a .dockerignore would also keep them out of the build context).
RUN rm -rf .venv var .env .git .pytest_cache .ruff_cache devtools \
    && find . -name __pycache__ -type d -prune -exec rm -rf {} +

# --- the image --------------------------------------------------------------------------------
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=taskplatform.settings.production

WORKDIR /app

# Dependencies first: this layer stays cached until the lock changes. Only production's packages
# (no embedded Redis, no test tools), each file checked against the hash in the lock.
COPY requirements.lock .
RUN pip install --require-hashes --no-deps -r requirements.lock

COPY --from=source /src .

# The sources compiled once here: with PYTHONDONTWRITEBYTECODE no process writes its bytecode,
# so each (web, worker, beat, Flower, every manage.py command) would compile the platform's
# modules again at every start, about 0.15 s. Static files are collected at build time and served
# by whitenoise; collectstatic needs a secret key to load the settings, not the real one.
RUN python -m compileall -q . \
    && DJANGO_SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput \
    && useradd --create-home --uid 1000 app \
    && mkdir -p var \
    && chown -R app:app var

# Celery refuses to be comfortable as root, and nothing here needs it.
USER app

EXPOSE 8000 5555
# The web server's processes (uvicorn reads it): one per core the container gets.
ENV WEB_CONCURRENCY=2
CMD ["uvicorn", "taskplatform.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--lifespan", "off", \
     "--ws-per-message-deflate", "false"]
