"""Leases of running jobs: the heartbeat that shows a run is alive, and a worker's drain.

The claim gives a run a lease of JOBS_LEASE_SECONDS. While handlers run, ONE daemon thread per
worker process renews the leases of the runs in that process every third of the lease: one
small UPDATE per run per interval, whatever the job does (not a write per step). When the
process dies (kill -9, out of memory, a segfault, a lost machine) the renewals stop, the lease
expires, and the reconciler (`jobs.services.jobs_recover_expired_leases`) takes the job back.

A cancelled job's run keeps renewing while it winds down: a live lease on a `cancelled` job
means a run that has not yet noticed, which the reconciler terminates after JOBS_CANCEL_GRACE.

A run that has lost its job stops before its lease ends. When a renewal finds the job no longer
this run's (cancelled and retried, taken back), the run is told at once and stops at its next
`ctx` call; a run that cannot renew (the database away) or that has lost its job and still runs
when its lease is about to end is terminated by its own heartbeat (in a Celery pool process: the
process is killed, and the worker's main process sees it go). So by the time its lease has
expired, and another run may claim the job, the old run is gone: two runs of a job never overlap.

Drain: when a worker is told to stop (SIGTERM, Celery's warm shutdown), its main process marks
the worker as draining in Redis. The heartbeat thread of each pool process looks for the mark
every second and asks the runs in its process to hand their jobs back (`HandBack`, raised at
their next `ctx` call), so a shutdown never waits for a long job, and the job goes on in
another worker from its last finished step.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.db import connection

from dbkit.conf import setting
from jobs.clock import db_now_plus
from jobs.models import Job, status_among
from jobs.redis_clients import redis_client

if TYPE_CHECKING:
    from jobs.runtime import JobContext

logger = logging.getLogger(__name__)

DRAIN_MARK_TTL = 3600  # seconds; a worker that never restarts must not leave the mark forever

# Set in a Celery pool process (`jobs.tasks`): there, a run past its lease is stopped by killing
# the process. Elsewhere (tests, an eager call) the heartbeat only marks the run lost.
TERMINATE_OVERDUE_RUNS = False


def _kill_this_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def lease_deadline() -> Any:
    """When a lease taken or renewed now expires: an expression of the database's clock (see
    `jobs.clock`), so that a reconciler on another host, whatever its own clock says, sees it
    expire exactly JOBS_LEASE_SECONDS after the write."""
    return db_now_plus(setting("JOBS_LEASE_SECONDS"))


def drain_key(hostname: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}jobs:draining:{hostname}"


def _redis() -> redis.Redis:
    return redis_client(socket_timeout=1, socket_connect_timeout=1)


def drain_mark(hostname: str, draining: bool) -> None:
    """Mark (or unmark) the worker `hostname` as draining. Never raises: with Redis down the
    worker still shuts down, and its jobs come back through their leases."""
    try:
        client = _redis()
        if draining:
            client.set(drain_key(hostname), "1", ex=DRAIN_MARK_TTL)
        else:
            client.delete(drain_key(hostname))
        client.close()
    except redis.RedisError as exc:
        logger.warning("could not %s the drain mark of %s: %s", "set" if draining else "clear", hostname, exc)


class Heartbeat:
    """The lease-renewing thread of one process, and the runs it keeps alive.

    `terminate` is called (from the heartbeat's thread) when a run is about to outlive its lease
    without having stopped; by default, in a Celery pool process, it kills the process.
    """

    max_tick = 1.0  # seconds between two looks at the drain mark (at most)

    def __init__(self, terminate: Any = None) -> None:
        self.pid = os.getpid()
        self.terminate = terminate
        self._lock = threading.Lock()
        self._runs: dict[Any, JobContext] = {}
        self._redis: redis.Redis | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-lease-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread (for tests; a process's heartbeat lives as long as the process)."""
        self._stopped.set()

    def add(self, ctx: JobContext) -> None:
        with self._lock:
            self._runs[ctx.job_id] = ctx

    def remove(self, ctx: JobContext) -> None:
        with self._lock:
            if self._runs.get(ctx.job_id) is ctx:
                del self._runs[ctx.job_id]

    def _tick(self) -> float:
        return min(self.max_tick, settings.JOBS_LEASE_SECONDS / 6)

    def _loop(self) -> None:
        while not self._stopped.wait(self._tick()):
            with self._lock:
                runs = list(self._runs.values())
            if not runs:
                continue
            self._look_for_drain(runs)
            # Each run's lease is renewed once a third of it has passed since its claim or its last
            # renewal: a run shorter than that is never renewed (its claim took the lease).
            now = time.monotonic()
            due = [ctx for ctx in runs if ctx.lease_until - now <= settings.JOBS_LEASE_SECONDS * 2 / 3]
            if due:
                self._renew(due)
            self._stop_overdue(runs)

    def _renew(self, runs: list[JobContext]) -> None:
        try:
            for ctx in runs:
                if ctx.lost:
                    continue
                started = time.monotonic()
                # Processing or cancelled, under this run's attempt: the run is still alive.
                renewed = Job.objects.filter(
                    status_among([Job.Status.PROCESSING, Job.Status.CANCELLED]), pk=ctx.job_id, attempts=ctx.attempt
                ).update(lease_expires_at=lease_deadline())
                if renewed:
                    ctx.lease_until = started + settings.JOBS_LEASE_SECONDS
                else:
                    # Retried after a cancellation, or taken back: another run may have the job.
                    # Stop at the next ctx call, and renew nothing more.
                    ctx.lost = True
        except Exception as exc:  # the database restarting: try again at the next tick
            logger.warning("could not renew job leases: %s", exc)
        finally:
            # No idle connection per process between two renewals (nor a dead one after a
            # database restart): one connect every third of a lease is cheap.
            connection.close()

    def _stop_overdue(self, runs: list[JobContext]) -> None:
        """Terminate a run about to outlive its lease (unrenewed: lost, or no database): once the
        lease has expired another run may claim the job, and the two must never overlap."""
        margin = 2 * self._tick()
        now = time.monotonic()
        overdue = [ctx for ctx in runs if now >= ctx.lease_until - margin and not ctx.overdue]
        if not overdue:
            return
        for ctx in overdue:
            logger.error("job %s: run %s is about to outlive its lease (%s); stopping it", ctx.job_id, ctx.attempt,
                         "it lost the job" if ctx.lost else "the lease could not be renewed")
            ctx.lost = ctx.overdue = True
        terminate = self.terminate or (_kill_this_process if TERMINATE_OVERDUE_RUNS else None)
        if terminate is not None:
            with self._lock:
                for ctx in overdue:
                    self._runs.pop(ctx.job_id, None)
            terminate()

    def _look_for_drain(self, runs: list[JobContext]) -> None:
        hostnames = {ctx.worker_hostname for ctx in runs if ctx.worker_hostname and not ctx.hand_back_requested}
        if not hostnames:
            return
        try:
            self._redis = self._redis or _redis()
            draining = {name for name in hostnames if self._redis.exists(drain_key(name))}
        except redis.RedisError:
            self._redis = None
            return
        for ctx in runs:
            if ctx.worker_hostname in draining:
                ctx.hand_back_requested = True


_heartbeat: Heartbeat | None = None
_heartbeat_lock = threading.Lock()


def heartbeat() -> Heartbeat:
    """This process's heartbeat, started on first use (after a fork: the child's own). Asked for
    at every job's run: without a lock or a `getpid` once it runs."""
    global _heartbeat
    beat = _heartbeat
    if beat is not None:
        return beat
    with _heartbeat_lock:
        if _heartbeat is None:
            _heartbeat = Heartbeat()
        return _heartbeat


def _forget_the_parents_heartbeat() -> None:
    """In a child just forked: its parent's heartbeat thread did not come with it, and the lock
    may have been held by a thread that did not either."""
    global _heartbeat, _heartbeat_lock
    _heartbeat = None
    _heartbeat_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_the_parents_heartbeat)
