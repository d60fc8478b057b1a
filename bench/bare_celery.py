"""The baseline of bench/shipped.py: a plain Celery app, no Django, with the settings the
platform's worker runs under (late acks, prefetch 1, JSON). Its one task adds one to a Redis
counter, so the bench sees all N done without a result backend."""

from __future__ import annotations

import os
from functools import cache

import redis
from celery import Celery

# Not the current app: the bench process also submits jobs through the platform's app.
app = Celery("bare", broker=os.environ.get("BARE_CELERY_BROKER", "redis://127.0.0.1:6379/0"), set_as_current=False)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], task_ignore_result=True, worker_hijack_root_logger=False)


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(app.conf.broker_url)


@app.task(name="bare.noop")
def noop(done_key: str) -> None:
    _redis().incr(done_key)


@app.task(name="bare.stamp")
def stamp(reply_key: str) -> None:
    """Say when it started running (this host's clock) on `reply_key`, a list the bench waits on."""
    import time

    _redis().rpush(reply_key, repr(time.time()))
