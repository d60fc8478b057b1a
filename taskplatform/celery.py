"""The Celery app: `celery -A taskplatform worker|beat|flower`."""

import functools
import logging
import os

from celery import Celery, signals

from dbkit.tasks import DatabaseTask, connections_after_task, connections_before_task, tasks_without_connections
from taskplatform import kombu_redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.production")

logger = logging.getLogger(__name__)

# kombu's Redis transports, minus a new client built for every command (see the module).
kombu_redis.install()

# Every task's worker run is wrapped as Django wraps a request (dbkit.tasks): the app's base class.
app = Celery("taskplatform", task_cls="dbkit.tasks:DatabaseTask")
# Every CELERY_* setting in Django's settings configures Celery (see settings/base.py).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
def _connect_pool_processes_ahead(**kwargs) -> None:
    # Celery's Django fix-up connects its `worker_process_init` receiver, which closes the database
    # connections a pool process inherited, from its own `worker_init` receiver (connected when
    # `app` was made, so before this one): connected here, ours runs after it in each pool process.
    from jobs.tasks import connect_before_the_first_job

    signals.worker_process_init.connect(connect_before_the_first_job, weak=False,
                                        dispatch_uid="jobs.tasks.connect_before_the_first_job")
    _take_over_the_fixups_task_hooks()
    _check_connections_of_foreign_tasks()


def _take_over_the_fixups_task_hooks() -> None:
    """In a worker, before it forks its pool: the app's task class (`dbkit.tasks.DatabaseTask`)
    does the work of the fix-up's `task_prerun` and `task_postrun` receivers (installed by its own
    `worker_init` receiver, which ran before this one), which are disconnected.

    With CELERY_DB_REUSE_MAX set, the fix-up counts the tasks to close the connections every that
    many (done after the task by the task class) and closes Django's caches after each task: a
    walk of the thread's caches whose `close` does nothing for the platform's Redis cache (done
    only for a backend that closes something). Those two walks and our own check before each
    task were about 6 % of a pool process's CPU per no-op job, and the signals' sending as much
    again (bench/README.md). With CELERY_DB_REUSE_MAX 0 (a new connection per task) the fix-up's
    receivers stay."""
    from celery.fixups.django import DjangoFixup
    from django.conf import settings

    if not settings.CELERY_DB_REUSE_MAX:
        return
    for fixup in app._fixups or ():
        if isinstance(fixup, DjangoFixup):
            signals.task_prerun.disconnect(fixup.worker_fixup.on_task_prerun)
            signals.task_postrun.disconnect(fixup.worker_fixup.on_task_postrun)


def _run_by_its_caller(task) -> bool:
    """A task run in its caller's thread (`apply()`, always-eager): the caller's connections and
    transaction are not the task's to check or close (the fix-up leaves them alone too)."""
    return bool(getattr(getattr(task, "request", None), "is_eager", False))


def _connections_before_foreign_task(sender=None, task=None, **kwargs) -> None:
    task = task or sender
    if not isinstance(task, DatabaseTask) and not _run_by_its_caller(task):
        connections_before_task()


def _connections_after_foreign_task(sender=None, task=None, **kwargs) -> None:
    task = task or sender
    if not isinstance(task, DatabaseTask) and not _run_by_its_caller(task):
        connections_after_task()


def _check_connections_of_foreign_tasks() -> None:
    """A task whose class is not the app's (`base=` a plain `celery.Task`) does not check its
    connections itself: for those alone, receivers of `task_prerun` and `task_postrun` do, at
    the cost of Celery sending both signals around every task again (`dbkit.tasks`)."""
    foreign = tasks_without_connections(app.tasks)
    if not foreign:
        return
    logger.info("tasks not based on dbkit.tasks.DatabaseTask, whose connections task signals check: %s",
                ", ".join(foreign))
    signals.task_prerun.connect(_connections_before_foreign_task, weak=False,
                                dispatch_uid="taskplatform.celery.connections_before_foreign_task")
    signals.task_postrun.connect(_connections_after_foreign_task, weak=False,
                                 dispatch_uid="taskplatform.celery.connections_after_foreign_task")


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


# What a pool process's work imports and no process's start does (webhooks/targets.py): the HTTP
# client of webhooks and of calls to outside services, DRF's renderer and the API's serializer for
# a webhook's payload. A worker's main process imports them before it forks its pool, so each pool
# process shares them (frozen with the rest, below) instead of importing its own at its first
# webhook. Celery's start-up run of Django's checks loads the URLconfs and with them the last two;
# with CELERY_SKIP_CHECKS set it does not.
POOL_PRELOADED = ("httpx", "rest_framework.renderers", "jobs.serializers")


@signals.worker_init.connect
def _load_what_the_pool_uses(**kwargs) -> None:
    import importlib

    for name in POOL_PRELOADED:
        importlib.import_module(name)


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
