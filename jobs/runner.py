"""One run of a job, from claim to outcome. Called by the Celery task with a job id."""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction

from jobs.errors import ClaimDeferred, InvalidTransition, JobNotFound, UnknownKind
from jobs.events import RunLost, event_append, step_begin, step_checkpoint
from jobs.leases import heartbeat
from jobs.models import Job
from jobs.registry import kind_get
from jobs.runtime import HandBack, JobContext, JobFailure, Suspend
from jobs.services import (
    job_claim,
    job_complete,
    job_fail,
    job_hand_back,
    job_suspend,
    run_lease_release,
    transitions,
)
from jobs.storable import json_refusal

logger = logging.getLogger(__name__)


def job_execute(*, job_id: Any, worker: str = "", worker_hostname: str = "", task_id: str = "") -> str:
    """Claim the job and run its handler once; record the outcome. Returns what happened.

    A second delivery of the same message finds the job claimed and does nothing. The outcome
    is written only if this run still owns the job: a job cancelled meanwhile stays cancelled.
    While the handler runs, this process's heartbeat renews the run's lease (`jobs.leases`).
    """
    try:
        job = job_claim(job_id=job_id, worker=worker, task_id=task_id)
    except ClaimDeferred as exc:
        # An earlier run of the job is still stopping: look again once its lease has run out (it
        # sends the job again itself if it stops sooner).
        logger.info("job %s not claimed yet: %s", job_id, exc)
        transitions.job_dispatch(job=Job(pk=job_id, kind=exc.kind), countdown=exc.retry_in)
        return "deferred"
    except (InvalidTransition, JobNotFound) as exc:
        logger.info("job %s not claimed: %s", job_id, exc)
        return "skipped"

    try:
        kind = kind_get(job.kind)
    except UnknownKind as exc:
        return _record(job_fail, job=job, code=UnknownKind.code, message=exc.message, retry=False)

    ctx = JobContext(job, worker_hostname=worker_hostname)
    beat = heartbeat()
    beat.add(ctx)
    try:
        return _run(kind, ctx, job)
    finally:
        beat.remove(ctx)


def _run(kind, ctx: JobContext, job) -> str:
    try:
        try:
            result = kind.call(ctx, job.input)  # typed kinds: the model in, JSON out (jobs.registry)
        finally:
            # A progress report held back by coalescing is written before the outcome, so the
            # log ends with the job's last reported state (a lost run raises RunLost here).
            ctx.flush()
    except Suspend as suspend:  # a question (`paused`), a wait (`waiting`): see jobs.extensions
        return _record(job_suspend, job=job, to=suspend.status, apply=suspend.apply, message=suspend.message,
                       on=suspend.on)
    except HandBack as exc:
        return _record(job_hand_back, job=job, reason=str(exc))
    except RunLost as exc:
        logger.info("job %s: run stopped: %s", job.pk, exc)
        run_lease_release(job=job)
        return "lost"
    except JobFailure as exc:
        return _record(job_fail, job=job, code=exc.code, message=exc.message, retry=False, record=exc.record)
    except SoftTimeLimitExceeded:
        limit = kind.time_limit
        message = f"the run took longer than its time limit ({limit:g}s)" if limit else "the run took too long"
        return _record(job_fail, job=job, code="timeout", message=message, retry=kind.on_time_limit == "retry")
    except Exception as exc:
        if database_lost(exc):
            return _hand_back_after_database_loss(job, exc)
        logger.exception("job %s (%s) raised", job.pk, job.kind)
        # The traceback is for the logs (above) and the admin: the owner and webhooks get the message.
        return _record(job_fail, job=job, code="exception", message=f"{type(exc).__name__}: {exc}",
                       traceback="".join(traceback.format_exc(limit=-8)))
    refusal = json_refusal(result)
    if refusal is not None:
        # Refused here, not by the database at the write: the job fails at once instead of
        # staying `processing` until its lease runs out and running again.
        message = (f"the handler returned a value that cannot be stored as JSON: {refusal}; return dicts, lists, "
                   "strings, finite numbers, booleans and None (dates and decimals as strings)")
        return _record(job_fail, job=job, code="result_not_json", message=message, retry=False)
    return _record(job_complete, job=job, result=result)


# A job id no row has: the rehearsal's moves match nothing.
_NO_JOB = uuid.UUID(int=0)
# Bounds of the rehearsal's statements (a table locked by a migration, a database that hangs):
# Celery kills a pool process that has not started within 4 s.
REHEARSAL_TIMEOUT_MS = 1000


def moves_rehearse() -> None:
    """Run a run's usual moves once against no job, in this process (a new pool process, before
    its first job): the claim, a step's begin and checkpoint, a progress report, the completion
    of a job with and without an owner. Each matches no row and writes nothing; each builds its
    statement's shape (`jobs.statements`) and prepares it on this connection (`dbkit.prepared`),
    and PostgreSQL's new backend loads the tables' catalog entries. Without it the first job of
    every new pool process paid all of that (about 10 ms for a no-op job, 20 ms for one with
    steps and progress), and its first events reached their watchers that much later than the
    rest (bench/README.md, "A new pool process's first job").

    In one transaction with short lock and statement timeouts of its own, which commits: none of
    these moves writes, and a refused move rolls nothing back (a rollback makes psycopg drop every
    statement the connection prepared). Any failure is only logged, and the first job then does
    this work itself, on a new connection, as it did before."""
    if connection.vendor != "postgresql":
        return
    stand_in = Job(pk=_NO_JOB, attempts=1, owner_id=None, parent_id=None)
    rehearsal = [
        lambda: job_claim(job_id=_NO_JOB, worker="rehearsal", task_id="rehearsal"),
        lambda: step_begin(job_id=_NO_JOB, run_attempt=1, step="rehearsal"),
        lambda: step_checkpoint(job_id=_NO_JOB, run_attempt=1, step="rehearsal", value=None),
        # With a text and without: an empty string is a constant of its statement, a shape of its
        # own (`jobs.statements`), and so is an empty result.
        lambda: event_append(job_id=_NO_JOB, type="progress", message={"fraction": 0.5, "text": "rehearsal"},
                             fields={"progress_fraction": 0.5, "progress_text": "rehearsal"}, run_attempt=1),
        lambda: event_append(job_id=_NO_JOB, type="progress", message={"fraction": 0.5, "text": ""},
                             fields={"progress_fraction": 0.5, "progress_text": ""}, run_attempt=1),
        # With a result (most runs return one; None is a shape of its own, left to the first job),
        # empty and not, without an owner and with one.
        lambda: job_complete(job=stand_in, result={"rehearsal": True}),
        lambda: job_complete(job=stand_in, result={}),
        lambda: job_complete(job=Job(pk=_NO_JOB, attempts=1, owner_id=0, parent_id=None), result={"rehearsal": True}),
        lambda: job_complete(job=Job(pk=_NO_JOB, attempts=1, owner_id=0, parent_id=None), result={}),
    ]
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:  # for this transaction only (a pooler's session is not ours)
                cursor.execute(f"SET LOCAL lock_timeout = {REHEARSAL_TIMEOUT_MS}")
                cursor.execute(f"SET LOCAL statement_timeout = {REHEARSAL_TIMEOUT_MS}")
            for move in rehearsal:
                try:
                    move()
                except (InvalidTransition, JobNotFound, RunLost):
                    pass  # no such job: what a rehearsal finds
    except Exception as exc:
        logger.warning("pool process could not rehearse a job's moves ahead of its first job: %s", exc)
        connection.close()  # the first job opens a fresh one (no timeout of the rehearsal left on it)


def database_lost(exc: BaseException) -> bool:
    """Is `exc` the database going away (a restart, a failover, a dropped connection) rather
    than the job's own error? Then the job is not to blame and must not lose an attempt.

    Proven, never guessed from the error's text: the run's connection is dead (the server
    closed it), or a fresh connection gets no answer. An error on a connection that still
    works (a statement timeout, a lock timeout, a message that merely says "connection") is
    the job's own, retried as any other.
    """
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return False
    if not _connection_dead():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return False  # the same connection answers: the statement failed, not the database
        except (OperationalError, InterfaceError):
            pass
    connection.close()  # the next query opens a fresh connection
    return True


def _connection_dead() -> bool:
    """Did the server close this process's connection (psycopg marks it closed or broken)?"""
    raw = connection.connection
    if raw is None:
        return False
    return bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))


def _hand_back_after_database_loss(job, exc: BaseException) -> str:
    """The run lost its database mid-way: hand the job back (not counted against its attempts,
    within the job's hand-back budget) as soon as the database answers, for at most half a
    lease; after that the lease expires and the reconciler takes the job back instead."""
    logger.warning("job %s: the database went away during the run (%s); handing the job back", job.pk, exc)
    deadline = time.monotonic() + settings.JOBS_LEASE_SECONDS / 2
    delay = 0.2
    while True:
        try:
            return _record(job_hand_back, job=job, reason=f"the database connection was lost: {exc}"[:500])
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _record(service, **kwargs: Any) -> str:
    try:
        job = service(**kwargs)
    except (InvalidTransition, RunLost) as exc:
        # The job moved on without this run (cancelled while it ran): keep what happened.
        logger.info("outcome of job %s dropped: %s", kwargs["job"].pk, exc)
        run_lease_release(job=kwargs["job"])
        return "lost"
    return job.status
