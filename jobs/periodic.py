"""Periodic passes: the tasks beat sends every few seconds (`jobs.reconcile`, `waits.due`,
`approvals.enforce_deadlines`, `webhooks.send_due`, …), each run alone.

Only one scheduler sends them (the leader, `ops.scheduler`), but their messages can still meet:
two platform workers (or a worker started without `-Q`, which serves the platform queue too)
working off a backlog after an outage, or the message a leader sent just before it lost its
lease next to its successor's. Each pass is written to be safe when repeated, so the guard here
is about "exactly one acts at a time": a run of a pass first takes that pass's lock and, when
another run holds it, does nothing (that run already does the work) and says so in the log.

- PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) on a connection of its own, so
  the lock lives exactly as long as the run holds it, whatever the pass does with Django's
  connection; a killed worker's lock goes with its connection. The session asks PostgreSQL for
  short TCP keepalives, so the lock of a worker whose machine vanished mid-run is released in
  about 11 s rather than after the operating system's two hours.
- SQLite (`make run`'s default, one machine): an exclusive `flock` on a file beside the database.

A task becomes a pass with `@shared_task(name=..., base=PeriodicPassTask)`. The guard applies
when a worker runs it; a direct call (`task()`) or `apply()` in a unit test runs the body only.
After each run the `pass_observer`s of `jobs.extensions` are told (ops records the passes' runs
for /readyz, /metrics and the dashboard), while the run still holds its lock. The log shows each
run: `pass NAME began at T` and `pass NAME ended at T after S s` (debug level), `pass NAME
skipped` (info).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from dbkit.tasks import DatabaseTask
from jobs.extensions import PassEvent, pass_observers

logger = logging.getLogger(__name__)

# Asked of PostgreSQL for the lock's session: probe an idle client after 5 s, every 2 s, give up
# after 3 unanswered probes (about 11 s). Ignored on a Unix socket (no machine can vanish there).
LOCK_SESSION_SETTINGS = "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3"

# This thread's connection for advisory locks, and the process that opened it.
_lock_connection = threading.local()


def pass_lock_key(name: str) -> int:
    """The advisory lock key of the pass `name`: a signed 64-bit number derived from the name, the
    same in every process (advisory locks are per database, so test databases never collide)."""
    digest = hashlib.blake2b(f"taskplatform periodic pass {name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _postgres_lock_connection() -> Any:
    """This thread's own connection for advisory locks (a forked pool process opens its own)."""
    if getattr(_lock_connection, "pid", None) != os.getpid():
        _lock_connection.wrapper = connections.create_connection(DEFAULT_DB_ALIAS)
        _lock_connection.pid = os.getpid()
    wrapper = _lock_connection.wrapper
    if wrapper.connection is None:
        wrapper.ensure_connection()
        with wrapper.cursor() as cursor:
            cursor.execute(LOCK_SESSION_SETTINGS)
    return wrapper


def pass_lock_connection_close() -> None:
    """Close this thread's lock connection, if it has one (it holds no lock between runs)."""
    if getattr(_lock_connection, "pid", None) == os.getpid():
        _lock_connection.wrapper.close()


def _try_advisory_lock(key: int) -> tuple[Any, bool]:
    """(connection, taken). A connection that broke since its last use is opened again once."""
    for attempt in (1, 2):
        wrapper = _postgres_lock_connection()
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
                return wrapper, bool(cursor.fetchone()[0])
        except DatabaseError:
            wrapper.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@contextmanager
def _postgres_pass_lock(name: str) -> Iterator[bool]:
    key = pass_lock_key(name)
    wrapper, taken = _try_advisory_lock(key)
    try:
        yield taken
    finally:
        if taken:
            try:
                with wrapper.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
                    released = cursor.fetchone()[0]
                if not released:
                    logger.warning("pass %s: its lock was already gone (the lock's connection broke)", name)
            except DatabaseError as exc:
                # The session is gone, and its locks with it.
                logger.warning("pass %s: could not release its lock: %s", name, exc)
                wrapper.close()


@contextmanager
def _file_pass_lock(name: str, database: str) -> Iterator[bool]:
    folder = Path(f"{database}.locks")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"pass-{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def pass_lock(name: str) -> Iterator[bool]:
    """Hold the lock of the pass `name` for the block; yields False (and holds nothing) when
    another run, in any process on any machine, holds it."""
    connection = connections[DEFAULT_DB_ALIAS]
    database = str(connection.settings_dict.get("NAME") or "")
    if connection.vendor == "postgresql":
        with _postgres_pass_lock(name) as taken:
            yield taken
    elif connection.vendor == "sqlite" and database and ":memory:" not in database and "mode=memory" not in database:
        with _file_pass_lock(name, database) as taken:
            yield taken
    else:  # an in-memory database lives in one process: nothing else can run the pass on it
        yield True


def _tell_observers(event: PassEvent) -> None:
    for observer in pass_observers():
        try:
            observer(event)
        except Exception:  # an observer must not fail the pass
            logger.exception("pass %s: an observer failed", event.name)


def pass_run(name: str, body: Callable[[], Any]) -> Any:
    """Run `body` as the pass `name` if no other run of it is in progress anywhere; else do
    nothing and return None. A lock that cannot be asked for (the database is away) counts as
    "not now": the pass could not work either; logged, and the next message tries again. What
    `body` raises goes to the caller."""
    with ExitStack() as stack:
        try:
            taken = stack.enter_context(pass_lock(name))
        except DatabaseError as exc:
            logger.warning("pass %s not run: the database is unavailable: %s", name, exc)
            return None
        if not taken:
            logger.info("pass %s skipped: another run of it is in progress", name)
            _tell_observers(PassEvent(name=name, what="skipped"))
            return None
        began = time.monotonic()
        logger.debug("pass %s began at %.6f", name, time.time())
        error = ""
        try:
            return body()
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            seconds = time.monotonic() - began
            _tell_observers(PassEvent(name=name, what="ended", seconds=seconds, error=error))
            # Before the lock is released: no other run's "began" can come before this line.
            logger.debug("pass %s ended at %.6f after %.3f s%s", name, time.time(), seconds,
                         f" ({error})" if error else "")


class PeriodicPassTask(DatabaseTask):
    """The base of every task that beat sends: a worker runs it under its pass lock
    (`pass_run`); a direct call or `apply()` runs the body as usual."""

    def run_traced(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.is_eager:
            return self.run(*args, **kwargs)
        return pass_run(self.name, lambda: self.run(*args, **kwargs))
