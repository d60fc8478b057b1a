"""The reconciler's passes, run by beat (`jobs.reconcile`): re-send lost dispatches, take back
the jobs of dead workers, terminate cancelled runs that ignore their cancellation, take the job
tables' statistics again while they are young and growing."""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.conf import settings
from django.db.models import Q

from dbkit.statistics import tables_analyze_if_grown
from jobs.broker import Held, broker_lost_its_data, dispatch_marked, dispatch_stranded, held_forget, job_messages
from jobs.clock import db_now, db_now_plus, db_time_filter
from jobs.errors import InvalidTransition
from jobs.events import event_append
from jobs.models import Job, JobEvent, JobStep
from jobs.services import transitions
from jobs.services.transitions import job_transition

logger = logging.getLogger(__name__)

Status = Job.Status


def jobs_redispatch_stale(*, grace: float, limit: int = 500) -> int:
    """Send again the message of `pending` jobs whose message was lost; never a slow one.

    A lost message: a dispatch that never reached the broker (a crash between commit and
    publish, the broker down at the time), or one the broker lost with its data (Redis restarted
    empty). A job pending for `grace` seconds whose dispatch is not marked in the broker
    (`jobs.broker`) is re-sent; one whose message still waits behind busy workers is left alone,
    so a long queue never grows by itself. A mark does not cover a message that a worker took
    and died holding (`dispatch_stranded`): the broker never gives it back, so such a job is re-sent
    as soon as its worker is seen dead (it stopped publishing what it holds), without the grace;
    one that a live worker has held unclaimed for a grace is re-sent too (another worker may start
    it); and when no message is queued at all, a marked job whose message no worker holds has
    lost it (a worker killed between taking it from the queue and publishing it). When
    the broker has lost its data (its epoch key is gone), every pending job's message is gone:
    they are re-sent at once, without the grace.
    Apart from a dead worker's, no more are sent than the queue is short of (pending jobs that may run now, less
    the `jobs.run` messages waiting in the queues): with at least as many waiting, a re-sent
    message would only queue behind them, so it waits until they drain. Returns how many were
    sent. Times are the database's (`jobs.clock`), as the jobs' `updated_at` are written with it.
    """
    now = db_now()
    lost_everything = broker_lost_its_data()
    if lost_everything:
        logger.warning("the broker lost its data (Redis restarted empty?): re-sending the pending jobs' messages")
    cutoff = db_now_plus(-(1 if lost_everything else grace))
    ready = Job.objects.filter(
        Q(run_after__isnull=True) | Q(run_after__lte=now),
        Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
        status=Status.PENDING,
    )
    holding = Held(set(), set(), set(), []) if lost_everything else dispatch_stranded(after=grace)
    sent = orphans_sent = _redispatch_held_by_the_dead(holding, now=now) if holding.dead else 0
    queued = job_messages(delivered=False)
    short = ready.count() - queued
    if short <= 0:
        return sent  # as many messages wait as jobs could run: slow, not lost (or behind them anyway)
    candidates = Job.objects.filter(status=Status.PENDING, updated_at__lt=cutoff)
    if not lost_everything:  # a job in its back-off has a delayed message: judged once it is due
        candidates = candidates.filter(Q(run_after__isnull=True) | Q(run_after__lt=cutoff))
    candidates = candidates.order_by("updated_at", "pk").only("pk", "kind", "updated_at", "run_after").annotate(
        now=now)
    held, stranded = holding.held, holding.stranded
    budget = min(short, limit) + sent
    after: tuple | None = None
    while sent < budget:
        chunk = candidates if after is None else candidates.filter(
            db_time_filter("updated_at", "gt", after[0])
            | (db_time_filter("updated_at", "exact", after[0]) & Q(pk__gt=after[1])))
        chunk = list(chunk[:500])
        if not chunk:
            break
        after = (chunk[-1].updated_at, chunk[-1].pk)
        marked = dispatch_marked(job.pk for job in chunk)
        for job in chunk:
            if job.pk in marked and str(job.pk) not in stranded and (queued or str(job.pk) in held):
                continue  # on its way: queued behind others, or held by a live worker
            if _dispatch_if_untouched(job, now=now):
                sent += 1
                if sent >= budget:
                    break
    if sent > orphans_sent:
        logger.warning("re-dispatched %d pending job(s) whose message was lost", sent - orphans_sent)
    return sent


def _redispatch_held_by_the_dead(holding: Held, *, now: Any) -> int:
    """Send again the pending jobs whose message a dead worker held (`holding.dead`), then forget
    those workers' records. A job due later (its back-off) gets a message with the countdown left."""
    sent = 0
    jobs = Job.objects.filter(pk__in=holding.orphaned, status=Status.PENDING).only(
        "pk", "kind", "updated_at", "run_after").annotate(now=now)
    for job in jobs:
        if _dispatch_if_untouched(job, now=now):
            sent += 1
    held_forget(*holding.dead)
    if sent:
        logger.warning("re-dispatched %d pending job(s) whose message died with its worker", sent)
    return sent


def _dispatch_if_untouched(job: Job, *, now: Any) -> bool:
    """Send `job` again unless someone moved it since it was read: the row is touched first (only
    if nobody else did), so two reconcilers never both send."""
    untouched = db_time_filter("updated_at", "exact", job.updated_at)
    if not Job.objects.filter(untouched, pk=job.pk, status=Status.PENDING).update(updated_at=now):
        return False
    due_in = (job.run_after - job.now).total_seconds() if job.run_after else 0
    transitions.job_dispatch(job=job, countdown=due_in if due_in > 0 else None)
    return True


def jobs_recover_expired_leases(*, limit: int = 500) -> int:
    """Take back the `processing` jobs whose worker stopped renewing their lease (it died: kill
    -9, out of memory, a segfault, a lost machine). Each goes back to `pending` and is sent
    again, with the lost run counted as an attempt and the error `worker_lost` recorded; its
    finished steps stay checkpointed. A job out of attempts fails with `worker_lost`, so a job
    that kills its worker every time (a poison job) ends instead of looping.

    The move is conditional on the lease still being expired under the same attempt, so a run
    that renews at the last moment keeps its job. Leases are written and compared with the
    database's clock (`jobs.clock`): a worker's own clock, ahead or behind, plays no part. Returns
    how many jobs were taken back.
    """
    # A null lease on a processing job: claimed before leases existed; its start time decides.
    lease_gone = Q(lease_expires_at__lt=db_now()) | Q(
        lease_expires_at__isnull=True, started_at__lt=db_now_plus(-settings.JOBS_LEASE_SECONDS)
    )
    expired = (
        Job.objects.filter(lease_gone, status=Status.PROCESSING)
        .order_by("lease_expires_at")
        .only("pk", "attempts", "max_attempts", "worker")[:limit]
    )
    recovered = 0
    for job in expired:
        error = {
            "code": "worker_lost",
            "message": f"the worker running attempt {job.attempts} ({job.worker or 'unknown'}) stopped renewing "
            "its lease: it died or lost its connection",
        }
        retry = job.attempts < job.max_attempts
        try:
            job_transition(
                job_id=job.pk,
                to=Status.PENDING if retry else Status.FAILED,
                from_=[Status.PROCESSING],
                only_attempt=job.attempts,
                where=lease_gone,
                fields={"error": error, "run_after": None} if retry else {"error": error},
                message={"error": error, "attempt": job.attempts, "lease_expired": True},
                dispatch=retry,
            )
        except InvalidTransition:
            continue  # renewed, finished or cancelled meanwhile
        recovered += 1
    if recovered:
        logger.warning("took back %d job(s) whose worker stopped renewing the lease", recovered)
    return recovered


def job_run_died(*, job_id: Any, task_id: str, reason: str) -> str:
    """The process running the message `task_id` of job `job_id` died (killed, out of memory, a
    segfault, stopped by its own heartbeat): its worker's main process saw it and says so at once,
    so the job need not wait for its lease to run out.

    A job still `processing` under that message is taken back as the reconciler would after the
    lease (`worker_lost`, the attempt counted, its finished steps kept; failed when out of
    attempts). A job that had already moved on (cancelled, retried) just loses the dead run's
    lease, and a retried job waiting for that run to stop is sent again. Returns what was done.
    """
    job = Job.objects.filter(pk=job_id, task_id=task_id).only("pk", "status", "attempts", "max_attempts",
                                                              "worker", "kind").first()
    if job is None:
        return "unknown"
    if job.status != Status.PROCESSING:
        released = Job.objects.filter(pk=job.pk, task_id=task_id, lease_expires_at__isnull=False).exclude(
            status=Status.PROCESSING).update_returning(lease_expires_at=None)
        if released is not None and released.status == Status.PENDING:
            transitions.job_dispatch(job=released)
        return "released" if released is not None else "nothing"
    error = {
        "code": "worker_lost",
        "message": f"the pool process running attempt {job.attempts} ({job.worker or 'unknown'}) died: {reason}"[:2000],
    }
    retry = job.attempts < job.max_attempts
    try:
        job_transition(
            job_id=job.pk,
            to=Status.PENDING if retry else Status.FAILED,
            from_=[Status.PROCESSING],
            only_attempt=job.attempts,
            where=Q(task_id=task_id),
            fields={"error": error, "run_after": None} if retry else {"error": error},
            message={"error": error, "attempt": job.attempts, "process_lost": True},
            dispatch=retry,
        )
    except InvalidTransition:
        return "nothing"  # it ended meanwhile
    logger.warning("job %s: took back attempt %s at once, its pool process died (%s)", job.pk, job.attempts, reason)
    return "taken back" if retry else "failed"


def jobs_terminate_cancelled_runs(*, grace: float, limit: int = 100) -> int:
    """Terminate, through Celery's revoke, the runs of jobs cancelled more than `grace` seconds
    ago that are still alive (their heartbeat still renews the lease: the job's code has
    reached no `ctx` call since). The job stays `cancelled`; its lease is cleared, and set again
    by the heartbeat if the run survives, so it is revoked again at the next pass. Returns how
    many runs were revoked."""
    alive = Job.objects.filter(
        status=Status.CANCELLED, lease_expires_at__gt=db_now(), finished_at__lt=db_now_plus(-grace)
    ).exclude(task_id="").only("pk", "task_id", "attempts", "lease_expires_at")[:limit]
    revoked = 0
    for job in alive:
        current_app.control.revoke(job.task_id, terminate=True, signal="SIGKILL")
        Job.objects.filter(pk=job.pk, attempts=job.attempts, lease_expires_at=job.lease_expires_at).update(
            lease_expires_at=None
        )
        event_append(
            job_id=job.pk, type="log", status="warning",
            message={"text": f"run {job.attempts} ignored the cancellation for {grace:g}s: terminated"},
        )
        revoked += 1
    if revoked:
        logger.warning("terminated %d cancelled run(s) past their grace", revoked)
    return revoked


def jobs_statistics_refresh(*, rows_added: int = 0) -> list[str]:
    """`ANALYZE` the jobs', the events' and the steps' tables if they have outgrown their
    statistics (`dbkit.statistics`): then every connection plans its kept statements again, made
    while the tables were small (a sequential scan kept by each event's foreign-key check, and by
    each step's test for a finished step of its name). Run by each reconciler pass (jobs submitted
    one by one, through the API; steps) and by a batch submit after its commit (`rows_added`: the
    jobs it added, each with its first event). Returns the tables analysed."""
    jobs, events = Job._meta.db_table, JobEvent._meta.db_table
    return tables_analyze_if_grown([jobs, events, JobStep._meta.db_table],
                                   rows_added={jobs: rows_added, events: rows_added})
