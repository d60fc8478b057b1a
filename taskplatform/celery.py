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


@functools.cache
def _beat_routes() -> tuple[frozenset[str], dict[str, str]]:
    """The names of the tasks beat sends, and the route to beat's own queue
    (settings.JOBS_PLATFORM_QUEUE): read once, as the router runs for every message."""
    from django.conf import settings

    return (frozenset(entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()),
            {"queue": settings.JOBS_PLATFORM_QUEUE})


def _route(name, args, kwargs, options, task=None, **kw):
    beat_tasks, platform = _beat_routes()
    return platform if name in beat_tasks else None


app.conf.task_routes = (_route,)


@signals.celeryd_init.connect
def _serve_every_queue_by_default(sender=None, conf=None, **kwargs) -> None:
    """A worker started without `-Q` serves the jobs queue, the platform queue and every queue a
    job kind asks for (`@job_kind(queue=...)`); `-Q` still picks a subset."""
    import django
    from kombu import Exchange, Queue

    django.setup()
    from django.conf import settings

    from jobs.registry import kinds_all

    queues = sorted({k.queue for k in kinds_all() if k.queue})
    names = dict.fromkeys([conf.task_default_queue, settings.JOBS_PLATFORM_QUEUE, *queues])
    conf.task_queues = [Queue(name, Exchange(name), routing_key=name) for name in names]
