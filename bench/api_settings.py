"""Settings of the server `bench/api.py` measures: the platform's, plus one bare DRF endpoint."""

from taskplatform.settings.development import *  # noqa: F403

ROOT_URLCONF = "bench.api_urls"

# BENCH_DB_POOL=1: psycopg's connection pool (Django 5.1+, needs the psycopg-pool package). Under
# ASGI each request runs in a thread of its own, so without a pool every request opens a new
# PostgreSQL connection; this measures what a pool saves.
if env.bool("BENCH_DB_POOL", default=False) and DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 4, "max_size": 16}  # noqa: F405
