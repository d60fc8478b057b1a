"""Celery tasks: thin, take an id, call a service."""

import logging
import os
import threading
import time
import uuid
from typing import Any

import redis
from billiard.einfo import ExceptionWithTraceback
from celery import shared_task
from celery.exceptions import Terminated, WorkerLostError
from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from celery.worker import state as worker_state
from celery.worker.request import Request
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from dbkit.tasks import DatabaseTask
from jobs import leases
from jobs.broadcast import flush_pending, publisher
from jobs.broker import dispatch_forget, held_forget, held_publish
from jobs.extensions import RunStart, run_observers
from jobs.leases import drain_mark
from jobs.periodic import PeriodicPassTask
from jobs.runner import job_execute, moves_rehearse
from jobs.services import (
    job_run_died,
    jobs_recover_expired_leases,
    jobs_redispatch_stale,
    jobs_statistics_refresh,
    jobs_terminate_cancelled_runs,
)

logger = logging.getLogger(__name__)

MAX_DATABASE_RETRIES = 10  # of a message whose claim found the database away (some 4 minutes)


class JobRunRequest(Request):
    """A `jobs.run` message as the worker's MAIN process sees it. When the pool process running it
    dies (kill -9, out of memory, a segfault, its heartbeat stopping a run past its lease) or is
    terminated by a revoke, the main process knows at once: it takes the job back then
    (`job_run_died`), instead of leaving it `processing` until its lease runs out. Celery then
    goes on as usual (the message is requeued, `task_reject_on_worker_lost`).
    https://docs.celeryq.dev/en/stable/userguide/tasks.html#requests-and-custom-requests
    """

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        # What Celery itself reads as a lost worker (request.py), and a revoke's termination.
        died = isinstance(exc, WorkerLostError | Terminated) or (
            isinstance(exc, SystemExit | KeyboardInterrupt) and not (self._already_cancelled or self._already_revoked)
        )
        if died and self.args:
            _take_back_at_once(job_id=self.args[0], task_id=self.id, reason=str(exc) or type(exc).__name__)
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


def _take_back_at_once(*, job_id: str, task_id: str, reason: str) -> None:
    """In the main process: never let a database hiccup break Celery's own handling (the lease
    remains the way back then)."""
    try:
        job_run_died(job_id=job_id, task_id=task_id, reason=reason)
    except Exception as exc:
        logger.warning("job %s: could not take the dead run back at once (its lease will): %s", job_id, exc)
    finally:
        connection.close()


class _OpenRun(threading.local):
    ends: tuple = ()  # what the observers of the run in progress return, to call as it ends


_open_run = _OpenRun()


def _run_ends() -> None:
    ends, _open_run.ends = _open_run.ends, ()
    for end in reversed(ends):
        end()


class JobRunTask(DatabaseTask):
    """`jobs.run`'s class: its run observers (`jobs.extensions.run_observer`) told of each run, by
    a worker (inside the connections' checks) or by its caller (`apply()`), as it begins, and as
    it ends after Celery's own lines about it (its result, its failure: they name the job too), in
    `after_return`. A run that ends as Celery calls no `after_return` for (a retry of its message,
    an ignored or rejected one) ends as the next run begins."""

    Request = JobRunRequest

    def run_traced(self, *args: Any, **kwargs: Any) -> Any:
        _run_ends()
        observers = run_observers()
        job_id = args[0] if args else kwargs.get("job_id")
        if observers and job_id is not None:
            request = self.request
            shadow = request.shadow
            run = RunStart(job_id=str(job_id), kind=shadow if shadow and shadow != self.name else "",
                           hostname=request.hostname or "", eager=bool(request.is_eager))
            _open_run.ends = tuple(end for observe in observers if (end := observe(run)) is not None)
        return self.run(*args, **kwargs)

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        _run_ends()


@shared_task(name="jobs.run", bind=True, ignore_result=True, base=JobRunTask)
def job_run(self, job_id: str) -> str:
    """Run the job `job_id` once (claim, handler, outcome). Safe to deliver twice."""
    hostname = self.request.hostname or ""
    try:
        return job_execute(
            job_id=job_id, worker=f"{hostname} pid {os.getpid()}", worker_hostname=hostname,
            task_id=self.request.id or "",
        )
    except (OperationalError, InterfaceError) as exc:
        # The database is away (restarting, failing over). The claim is atomic, so running this
        # again later is safe whatever point the run reached; meanwhile the reconciler and the
        # lease cover a job whose retries run out.
        connection.close()
        if self.request.retries >= MAX_DATABASE_RETRIES:
            dispatch_forget(job_id)  # no message left for it: the reconciler sends one after the grace
            raise
        countdown = min(2 ** self.request.retries, 30)
        logger.warning("job %s: the database is unavailable (%s); its message is retried in %d s (retry %d of %d)",
                       job_id, exc, countdown, self.request.retries + 1, MAX_DATABASE_RETRIES)
        raise self.retry(exc=exc, countdown=countdown, max_retries=MAX_DATABASE_RETRIES) from exc


@shared_task(name="jobs.reconcile", base=PeriodicPassTask, ignore_result=True)
def jobs_reconcile() -> dict[str, int]:
    """Run by beat: re-send the messages of pending jobs that never reached a worker, take back
    the jobs of dead workers (expired leases), terminate cancelled runs past their grace, and
    take the job tables' statistics again while they are young and growing."""
    try:
        return {
            "redispatched": jobs_redispatch_stale(grace=settings.JOBS_DISPATCH_GRACE),
            "recovered": jobs_recover_expired_leases(),
            "terminated": jobs_terminate_cancelled_runs(grace=settings.JOBS_CANCEL_GRACE),
            "analysed": len(jobs_statistics_refresh()),
        }
    except (OperationalError, InterfaceError) as exc:
        # The database restarting: nothing to do until it answers; the next pass catches up.
        logger.warning("reconciler pass skipped, the database is unavailable: %s", exc)
        connection.close()
        return {}


@worker_shutting_down.connect
def _start_draining(sender, **kwargs) -> None:
    """SIGTERM: the runs of this worker hand their jobs back at their next ctx call."""
    drain_mark(str(sender), draining=True)


@worker_ready.connect
def _stop_draining(sender, **kwargs) -> None:
    """A worker that starts again under the same name takes jobs as usual."""
    drain_mark(str(getattr(sender, "hostname", sender)), draining=False)


def held_job_ids(timer: Any) -> set[str]:
    """In a worker's main process: the jobs whose `jobs.run` message (a `JobRunRequest`, whatever
    its shadow name) it holds, running or reserved
    (`reserved_requests` counts the running ones too) or waiting on its timer for their countdown
    (the timer's entries whose first argument is a request, as `celery inspect scheduled` reads
    them)."""
    ids = {str(request.args[0]) for request in list(worker_state.reserved_requests)
           if isinstance(request, JobRunRequest) and request.args}
    queue = getattr(timer, "_queue", None)  # kombu's timer, the worker's with its event loop
    for item in list(timer.schedule.queue if queue is None else queue):
        entry = item.entry
        args = entry.args
        if not entry.canceled and args and isinstance(args[0], JobRunRequest) and args[0].args:
            ids.add(str(args[0].args[0]))
    return ids


class HeldPublisher:
    """Publishes what a worker's main process holds (`jobs.broker.held_publish`): at each tick
    when it changed, and at least every third of JOBS_HELD_STALE_AFTER so the worker stays live.
    One Redis round trip a tick at most, whatever the number of messages: none per message. With
    Redis away it tries every third of JOBS_HELD_STALE_AFTER, not every tick: a failing attempt
    (the client's retries) holds the worker's event loop for seconds."""

    def __init__(self, holder: str, timer: Any) -> None:
        self.holder = holder
        self.timer = timer
        self.published: set[str] | None = None
        self.published_at = float("-inf")
        self.retry_at: float | None = None  # set while Redis does not answer: when to try again

    def tick(self) -> None:
        if self.retry_at is not None and time.monotonic() < self.retry_at:
            return  # Redis did not answer: a failed attempt can block this loop for seconds
        for attempt in range(3):
            try:
                ids = held_job_ids(self.timer)
                break
            except RuntimeError:  # a set changed size under a pool's thread (`-P threads`): look again
                if attempt == 2:
                    logger.warning("could not list the messages this worker holds: they kept changing")
                    return
            except Exception:  # never let this break the worker's event loop
                logger.exception("could not list the messages this worker holds")
                return
        now = time.monotonic()
        if ids == self.published and now - self.published_at < settings.JOBS_HELD_STALE_AFTER / 3:
            return
        try:
            held_publish(self.holder, ids)
        except redis.RedisError as exc:
            retry_in = settings.JOBS_HELD_STALE_AFTER / 3
            if self.retry_at is None:
                logger.warning("could not publish the messages this worker holds (tried again every %g s): %s",
                               retry_in, exc)
            self.retry_at = time.monotonic() + retry_in
            return
        if self.retry_at is not None:
            logger.info("the messages this worker holds are published again")
            self.retry_at = None
        self.published, self.published_at = ids, now


_held_publishers: list[HeldPublisher] = []


@worker_ready.connect
def _held_publishing_begins(sender, **kwargs) -> None:
    """In the worker's main process, once it consumes: publish what it holds on its own timer.
    The holder's name is its node name, pid and a random part: a worker restarted under the same
    name does not overwrite what its killed predecessor held."""
    timer = getattr(sender, "timer", None)
    if timer is None:
        return
    holder = f"{sender.hostname}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
    publisher = HeldPublisher(holder, timer)
    _held_publishers.append(publisher)
    publisher.tick()
    timer.call_repeatedly(settings.JOBS_HELD_PUBLISH_INTERVAL, publisher.tick)


@worker_shutdown.connect
def _held_publishing_ends(sender=None, **kwargs) -> None:
    """A clean shutdown: kombu gave the unstarted messages back to the queue, nothing is held."""
    held_forget(*(publisher.holder for publisher in _held_publishers))
    _held_publishers.clear()


@worker_process_init.connect
def _stop_overdue_runs_by_exiting(**kwargs) -> None:
    """In a pool process, a run about to outlive its lease is stopped by killing the process
    (`jobs.leases`): the worker's main process sees it and takes the job back at once."""
    leases.TERMINATE_OVERDUE_RUNS = True


# Seconds a pool process waits for PostgreSQL to accept its connection ahead of its first job.
CONNECT_AHEAD_TIMEOUT = 2


def connect_before_the_first_job(**kwargs) -> None:
    """In a new pool process (at the worker's start, and each time one is replaced: after a job
    that left it over `WORKER_MAX_MEMORY_PER_CHILD_MB`, or after `WORKER_MAX_TASKS_PER_CHILD`
    jobs), open the database connection and the push thread's Redis
    connection now. Otherwise its first job paid both, and that job's first event reached its
    watchers some 20 ms later than the events after it (bench/README.md, "A new pool process's
    first event"). Then it rehearses a run's moves against no job (`jobs.runner.moves_rehearse`),
    so that the first job finds its statements built and prepared. The push thread connects in
    the background; a failure here is only logged, and the first job connects (or fails) as it
    would have.

    A `worker_process_init` receiver, connected by `taskplatform.celery` so that it runs after
    Celery's Django fix-up's, which closes the database connections a pool process inherited."""
    publisher()
    options = connection.settings_dict.setdefault("OPTIONS", {})
    if "pool" in options:
        return  # taking a connection from a pool may wait longer than Celery gives a pool process to start
    bounded = connection.vendor == "postgresql"
    previous = options.get("connect_timeout")
    if bounded:  # Celery kills a pool process that has not started within 4 s (worker_proc_alive_timeout)
        options["connect_timeout"] = min(int(previous or CONNECT_AHEAD_TIMEOUT), CONNECT_AHEAD_TIMEOUT)
    try:
        connection.ensure_connection()
    except Exception as exc:
        logger.warning("pool process could not connect to the database ahead of its first job: %s", exc)
    else:
        moves_rehearse()
    finally:
        if bounded:
            if previous is None:
                del options["connect_timeout"]
            else:
                options["connect_timeout"] = previous


@worker_process_shutdown.connect
def _push_the_last_events(**kwargs) -> None:
    """A pool process being retired (max tasks per child, shutdown) first sends what it wrote."""
    flush_pending(timeout=2.0)
