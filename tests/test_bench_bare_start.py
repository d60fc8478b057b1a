"""The bare process whose start `bench/shipped.py` (its `start` phase) sets beside `manage.py
submit`'s: Django and Celery on the same PostgreSQL and Redis, one statement and one message, and
nothing of the platform loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import redis
from django.conf import settings
from django.db import connection

from bench.shipped import BASE_DIR
from tests.support import processes

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the bench measures on PostgreSQL"),
    pytest.mark.django_db,
]

PLATFORM_PACKAGES = {"taskplatform", "jobs", "approvals", "waits", "webhooks", "ops", "accounts", "demo", "dbkit"}

# Runs the script as `python bench/bare_start.py` does, then lists the platform's modules it loaded.
RUN_AND_LIST = (
    "import runpy, sys; runpy.run_path('bench/bare_start.py', run_name='__main__'); "
    f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(PLATFORM_PACKAGES)!r}))"
)


def test_the_bare_start_sends_one_message_and_loads_nothing_of_the_platform():
    queue = f"bench-start-test-{uuid.uuid4().hex[:8]}"
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=processes.test_database_url(), REDIS_URL=settings.CELERY_BROKER_URL, BARE_START_QUEUE=queue,
               PYTHONPATH="")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        done = subprocess.run([sys.executable, "-c", RUN_AND_LIST], cwd=BASE_DIR, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "[]"
        assert client.llen(queue) == 1
    finally:
        client.delete(queue, f"_kombu.binding.{queue}")
