"""The reconciler's passes, run by beat (`jobs.reconcile`): re-send lost dispatches, take back
the jobs of dead workers, terminate cancelled runs that ignore their cancellation."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.events import event_append
from jobs.models import Job
from jobs.services import transitions
from jobs.services.transitions import job_transition

logger = logging.getLogger(__name__)

Status = Job.Status


def jobs_redispatch_stale(*, grace: float, limit: int = 500) -> int:
    """Send again the message of `pending` jobs that have not moved for `grace` seconds.

    Covers a dispatch that never reached a worker (the broker was down at commit, Redis
    restarted empty, a crash between commit and publish). A job whose message was only slow
    gets a duplicate, which its atomic claim makes harmless. Each job is re-sent at most once
    per `grace`. Returns how many were sent.
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=grace)
    stale = (
        Job.objects.filter(status=Status.PENDING, updated_at__lt=cutoff)
        .filter(Q(run_after__isnull=True) | Q(run_after__lt=cutoff))
        .order_by("updated_at")
        .only("pk", "kind", "updated_at")[:limit]
    )
    sent = 0
    for job in stale:
        # Touch the row first (only if nobody else did), so two reconcilers never both send.
        if Job.objects.filter(pk=job.pk, status=Status.PENDING, updated_at=job.updated_at).update(updated_at=now):
            transitions.job_dispatch(job=job)
            sent += 1
    if sent:
        logger.warning("re-dispatched %d pending job(s) idle for more than %ss", sent, grace)
    return sent


def jobs_recover_expired_leases(*, limit: int = 500) -> int:
    """Take back the `processing` jobs whose worker stopped renewing their lease (it died: kill
    -9, out of memory, a segfault, a lost machine). Each goes back to `pending` and is sent
    again, with the lost run counted as an attempt and the error `worker_lost` recorded; its
    finished steps stay checkpointed. A job out of attempts fails with `worker_lost`, so a job
    that kills its worker every time (a poison job) ends instead of looping.

    The move is conditional on the lease still being expired under the same attempt, so a run
    that renews at the last moment keeps its job. Returns how many jobs were taken back.
    """
    now = timezone.now()
    # A null lease on a processing job: claimed before leases existed; its start time decides.
    lease_gone = Q(lease_expires_at__lt=now) | Q(
        lease_expires_at__isnull=True, started_at__lt=now - timedelta(seconds=settings.JOBS_LEASE_SECONDS)
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


def jobs_terminate_cancelled_runs(*, grace: float, limit: int = 100) -> int:
    """Terminate, through Celery's revoke, the runs of jobs cancelled more than `grace` seconds
    ago that are still alive (their heartbeat still renews the lease: the job's code has
    reached no `ctx` call since). The job stays `cancelled`; its lease is cleared, and set again
    by the heartbeat if the run survives, so it is revoked again at the next pass. Returns how
    many runs were revoked."""
    now = timezone.now()
    alive = Job.objects.filter(
        status=Status.CANCELLED, lease_expires_at__gt=now, finished_at__lt=now - timedelta(seconds=grace)
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

