"""The Celery app: `celery -A taskplatform worker|beat|flower`."""

import functools
import os
import time

from celery import Celery, signals

from taskplatform import kombu_redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.production")

# kombu's Redis transports, minus a new client built for every command (see the module).
kombu_redis.install()

app = Celery("taskplatform")
# Every CELERY_* setting in Django's settings configures Celery (see settings/base.py).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# A connection that finished a task this recently is taken as alive for the next one; one idle
# longer is checked (CONN_HEALTH_CHECKS: a `SELECT 1`) before the task uses it. Back to back,
# the check was a third of a no-op job's round trips to PostgreSQL (bench/README.md). A restart
# of PostgreSQL inside this window fails the next task's first statement instead: the claim is
# atomic, so the message is retried (jobs.tasks) and the broken connection replaced after it.
CONNECTION_TRUSTED_SECONDS = 2.0
_connections_last_used = [float("-inf")]


@signals.worker_init.connect
def _connect_pool_processes_ahead(**kwargs) -> None:
    # Celery's Django fix-up connects its `worker_process_init` receiver, which closes the database
    # connections a pool process inherited, from its own `worker_init` receiver (connected when
    # `app` was made, so before this one): connected here, ours runs after it in each pool process.
    from jobs.tasks import connect_before_the_first_job

    signals.worker_process_init.connect(connect_before_the_first_job, weak=False,
                                        dispatch_uid="jobs.tasks.connect_before_the_first_job")


@signals.task_prerun.connect
def _connections_before_task(**kwargs) -> None:
    # With CELERY_DB_REUSE_MAX the fix-up keeps connections; do what Django does around a
    # request instead: drop a connection that broke or outlived CONN_MAX_AGE.
    from django.db import close_old_connections, connections

    close_old_connections()
    if time.monotonic() - _connections_last_used[0] < CONNECTION_TRUSTED_SECONDS:
        for connection in connections.all(initialized_only=True):
            if connection.connection is not None and not connection.errors_occurred:
                connection.health_check_done = True


@signals.task_postrun.connect
def _connections_after_task(**kwargs) -> None:
    from django.db import close_old_connections

    close_old_connections()
    _connections_last_used[0] = time.monotonic()


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


@signals.worker_before_create_process.connect
def _freeze_before_forking(**kwargs) -> None:
    """In a worker's main process, just before it forks a pool process: what the main process
    holds (Django, the apps, Celery) goes out of the garbage collector's full passes, here and in
    the child, which then shares those pages instead of copying them (taskplatform/heap.py)."""
    from taskplatform.heap import freeze_startup_objects

    freeze_startup_objects()


# A pool process runs the job in its main thread and pushes its events from a thread of its own
# (jobs.broadcast). While the job's Python runs, that thread waits for the GIL until the main
# thread blocks on I/O or the switch interval (5 ms by default) makes it let go. Timed per hop of
# an answered job's `processing` push (bench/README.md): from queued to sent 3.2 ms at 5 ms, 1.2 ms
# at 0.5 ms; the push as a whole 10.3 against 7.3 ms. The other threads (the push, the lease's
# heartbeat) are idle most of the time, and the interval matters only while one waits.
POOL_SWITCH_INTERVAL = 0.0005


@signals.worker_process_init.connect
def _switch_threads_sooner(**kwargs) -> None:
    """In each pool process: the push thread gets the GIL within half a millisecond."""
    import sys

    sys.setswitchinterval(POOL_SWITCH_INTERVAL)
