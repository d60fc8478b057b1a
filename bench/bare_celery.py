"""The baseline of bench/shipped.py: a plain Celery app, no Django, with the settings the
platform's worker runs under (late acks, prefetch 1, JSON). Its one task adds one to a Redis
counter, so the bench sees all N done without a result backend."""

from __future__ import annotations

import os
import sys
from functools import cache

import redis
from celery import Celery, signals

# Not the current app: the bench process also submits jobs through the platform's app.
app = Celery("bare", broker=os.environ.get("BARE_CELERY_BROKER", "redis://127.0.0.1:6379/0"), set_as_current=False)


def transport_options() -> dict[str, bool]:
    """kombu's acknowledgement emulation on Redis (its `unacked` hash: a MULTI/EXEC at each delivery
    and each ack) is Celery's default, and on unless BARE_ACK_EMULATION=off. The platform ships
    without it; the bench's floor (bare + SQL) runs without it too."""
    return {"ack_emulation": os.environ.get("BARE_ACK_EMULATION", "on") != "off"}


app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], task_ignore_result=True, worker_hijack_root_logger=False,
                broker_transport_options=transport_options())


def refuse_django(baseline: Celery) -> None:
    """Stop a worker of `baseline` at its start if Django is loaded in it. Celery installs its
    Django fix-up into every app made while `DJANGO_SETTINGS_MODULE` is set; the fix-up then sets
    Django up in the worker (the platform's apps, its Celery signal receivers) and runs its own
    receivers around each task. The bench measures the platform against a worker without them.
    In the bench's own process (Django set up, no worker of `baseline` started) this does nothing."""

    @signals.worker_init.connect(weak=False)
    def _bare_or_not_at_all(sender=None, **kwargs) -> None:
        if getattr(sender, "app", None) is not baseline:
            return
        django_apps = sys.modules.get("django.apps")  # kombu imports a piece of Django whenever it is installed
        if os.environ.get("DJANGO_SETTINGS_MODULE") or (django_apps is not None and django_apps.apps.ready):
            raise SystemExit(f"bench: the baseline worker of {baseline.main!r} has Django loaded "
                             "(DJANGO_SETTINGS_MODULE set in its environment): it would not be bare")


refuse_django(app)


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
