"""A Celery task run by a worker, wrapped as Django wraps a request: its database connections
checked before and after (`DatabaseTask`, the Celery app's base task class: `taskplatform.celery`).

Celery's Django fix-up does this with `task_prerun` and `task_postrun` receivers. Any receiver of
those signals makes Celery's tracer send both around every task, and the sending (the live
receivers looked up, each called with the task's request as keywords) was about 6 % of a pool
process's CPU for a no-op job, beside the checks themselves (bench/README.md, "The task signals
around each job" and "Around each task, no signal"). A task class's `__call__` does the same
work with no signal sent: while no receiver is connected, Celery's tracer skips both.

- Before a task: what Django does at the start of a request, drop a connection that broke or
  outlived CONN_MAX_AGE. A connection the last task ended with moments ago
  (`CONNECTION_TRUSTED_SECONDS`) was checked then and is trusted, with no health check (a round
  trip) before its first statement.
- After it: what Django does at the end of a request, and the fix-up's recycling of the
  connections every CELERY_DB_REUSE_MAX tasks (0: never). Caches are closed only when a
  configured backend's `close` does something.

A task run by its caller (`apply()`, always-eager, or called as a function) runs in the caller's
thread and transaction: its connections are not the task's to check or close.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from celery import Task

# A connection that finished a task this recently is taken as alive for the next one; one idle
# longer is checked (CONN_HEALTH_CHECKS: a `SELECT 1`) before the task uses it. Back to back,
# the check was a third of a no-op job's round trips to PostgreSQL (bench/README.md). A restart
# of PostgreSQL inside this window fails the next task's first statement instead: the claim is
# atomic, so the message is retried (jobs.tasks) and the broken connection replaced after it.
CONNECTION_TRUSTED_SECONDS = 2.0


class _TaskConnections(threading.local):
    """The connections the last task of this thread used, when it ended, and how many tasks ran
    since they were last recycled (one per thread: a pool's threads each have their own)."""

    used: tuple = ()
    ended = float("-inf")
    tasks = 0


task_connections = _TaskConnections()


class DatabaseTask(Task):
    """A task whose run by a worker is wrapped in `connections_before_task` and
    `connections_after_task`. A subclass puts its own work around the body in `run_traced`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # called as a function: Celery's own call
            return super().__call__(*args, **kwargs)
        # Celery's tracer has pushed this run's request already: the body runs as it would call it.
        if request.is_eager:
            return self.run_traced(*args, **kwargs)
        connections_before_task()
        try:
            return self.run_traced(*args, **kwargs)
        finally:
            connections_after_task()

    def run_traced(self, *args: Any, **kwargs: Any) -> Any:
        """The body, as Celery's tracer runs it: by a worker (inside the connections' checks) or
        by its caller (`apply()`, `request.is_eager`)."""
        return self.run(*args, **kwargs)


def connections_before_task() -> None:
    state = task_connections
    if time.monotonic() - state.ended < CONNECTION_TRUSTED_SECONDS:
        for connection in state.used:
            if connection.connection is not None and not connection.errors_occurred:
                connection.health_check_done = True
        return
    from django.db import close_old_connections

    close_old_connections()


def connections_after_task() -> None:
    from django.conf import settings
    from django.db import connections

    state = task_connections
    used = tuple(connections.all(initialized_only=True))
    state.tasks += 1
    if settings.CELERY_DB_REUSE_MAX and state.tasks >= settings.CELERY_DB_REUSE_MAX:
        state.tasks = 0
        for connection in used:
            connection.close()
    else:
        for connection in used:
            connection.close_if_unusable_or_obsolete()
    if _caches_that_close():
        from django.core.cache import close_caches

        close_caches()
    state.used = used
    state.ended = time.monotonic()


@functools.cache
def _caches_that_close() -> bool:
    """Whether a configured cache's backend closes anything when asked (the base class's `close`
    does nothing, and neither Django's Redis cache nor its local-memory cache overrides it)."""
    from django.conf import settings
    from django.core.cache import caches
    from django.core.cache.backends.base import BaseCache

    return any(type(caches[alias]).close is not BaseCache.close for alias in settings.CACHES)


def tasks_without_connections(tasks: Any) -> list[str]:
    """The names of the tasks in `tasks` (an app's registry) whose class is not a `DatabaseTask`:
    a task made with a base class of its own (`base=` a plain `celery.Task`). Their connections
    are checked by signal receivers instead (`taskplatform.celery`)."""
    return sorted(name for name, task in tasks.items() if not isinstance(task, DatabaseTask))
