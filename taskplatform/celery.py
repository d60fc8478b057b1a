"""The Celery app: `celery -A taskplatform worker|beat|flower`."""

import functools
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.production")

app = Celery("taskplatform")
# Every CELERY_* setting in Django's settings configures Celery (see settings/base.py).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_connections(**kwargs) -> None:
    # With CELERY_DB_REUSE_MAX the fix-up keeps connections; do what Django does around a
    # request instead: drop a connection that broke or outlived CONN_MAX_AGE.
    from django.db import close_old_connections

    close_old_connections()


# Beat's housekeeping (the reconciler, due waits, deadlines, webhook retries) has a queue of its
# own, served by a small worker of its own (`platform-worker` under `make run` and in compose):
# with every job slot busy with long jobs, a dead worker's jobs are still taken back, waits still
# wake and deadlines still fire.
PLATFORM_QUEUE = "platform"


@functools.cache
def _beat_tasks() -> frozenset[str]:
    """The names of the tasks beat sends (read once: the router runs for every message)."""
    from django.conf import settings

    return frozenset(entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values())


def _route(name, args, kwargs, options, task=None, **kw):
    return {"queue": PLATFORM_QUEUE} if name in _beat_tasks() else None


app.conf.task_routes = (_route,)


@signals.celeryd_init.connect
def _serve_every_queue_by_default(sender=None, conf=None, **kwargs) -> None:
    """A worker started without `-Q` serves the jobs queue, the platform queue and every queue a
    job kind asks for (`@job_kind(queue=...)`); `-Q` still picks a subset."""
    import django
    from kombu import Exchange, Queue

    django.setup()
    from jobs.registry import kinds_all

    names = dict.fromkeys([conf.task_default_queue, PLATFORM_QUEUE, *sorted({k.queue for k in kinds_all() if k.queue})])
    conf.task_queues = [Queue(name, Exchange(name), routing_key=name) for name in names]
