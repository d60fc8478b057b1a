"""The baselines `bench/shipped.py` measures the platform against are bare: their workers run
without Django. The bench sets `DJANGO_SETTINGS_MODULE` for itself, and Celery installs its
Django fix-up into any app made while it is set: the fix-up then sets Django up in the worker,
the platform's Celery signal receivers with it, and runs them around every task."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import redis
from django.conf import settings

from bench import bare_celery
from bench.shipped import BASE_DIR, baseline_worker


@pytest.mark.skipif(not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")),
                    reason="the bench's baselines run on REDIS_URL's TCP Redis: one URL for kombu and redis-py")
def test_the_bench_starts_a_baseline_worker_without_django():
    assert os.environ.get("DJANGO_SETTINGS_MODULE")  # as in the bench's own process
    broker = settings.CELERY_BROKER_URL
    queue, key = f"bare-test-{uuid.uuid4().hex[:8]}", f"bench:test:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(broker)
    before = bare_celery.app.conf.broker_url
    bare_celery.app.conf.broker_url = broker
    try:
        with baseline_worker("bench.bare_celery", queue, 1, broker) as worker:
            bare_celery.stamp.apply_async(args=[key], queue=queue)
            deadline = time.monotonic() + 60
            while not client.llen(key) and worker.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.llen(key), f"the baseline worker ran no task (its exit status: {worker.poll()})"
    finally:
        bare_celery.app.conf.broker_url = before
        client.delete(key, queue)


def test_a_baseline_worker_with_django_loaded_stops_at_its_start():
    env = {**os.environ, "BARE_CELERY_BROKER": settings.CELERY_BROKER_URL, "PYTHONPATH": str(BASE_DIR)}
    started = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "bench.bare_celery", "worker", "-l", "WARNING", "-c", "1",
         "-Q", f"bare-test-{uuid.uuid4().hex[:8]}", "--without-mingle", "--without-gossip"],
        cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert "has Django loaded" in started.stderr + started.stdout
