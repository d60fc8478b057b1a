"""The baseline of the throughput bench: a bare Celery task on the platform's own app and settings.

It does nothing but count itself done in a Redis counter, so the bench can tell when the worker
has run all N tasks without a result backend. The bench's worker imports this module with
`--include bench.baseline_tasks`; no other worker does.
"""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings

from taskplatform.celery import app


@cache
def _redis() -> redis.Redis:
    # One client (and connection pool) per worker process, made lazily in the child after fork.
    return redis.Redis.from_url(settings.REDIS_URL)


@app.task(name="bench.noop", ignore_result=True)
def noop(done_key: str) -> None:
    """Do nothing but add one to the counter `done_key` (the bench's finish line)."""
    _redis().incr(done_key)
