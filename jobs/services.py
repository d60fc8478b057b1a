"""Every write to a job goes through here.

`job_transition` is the only function that changes `Job.status`. The other services are the
named moves built on it: submit, claim, complete, fail or retry, pause, cancel, retry by hand.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from jobs.errors import IdempotencyConflict, InvalidInput, InvalidTransition, JobNotFound, UnknownKind
from jobs.events import event_append, event_record, events_record_first, job_update_with_event
from jobs.leases import lease_deadline
from jobs.models import Job
from jobs.registry import kind_get

logger = logging.getLogger(__name__)

Status = Job.Status
# The statuses the owner's webhooks can be told about (see `webhooks`).
WEBHOOK_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.PAUSED, Status.CANCELLED})


def _sources_for(to: str) -> set[str]:
    return {source for source, targets in Job.TRANSITIONS.items() if to in targets}


def job_transition(
    *,
    job_id: Any,
    to: str,
    from_: Iterable[str] | None = None,
    fields: dict[str, Any] | None = None,
    message: dict[str, Any] | None = None,
    dispatch: bool = False,
    countdown: float | None = None,
    only_attempt: int | None = None,
    where: Q | None = None,
    has_owner: bool | None = None,
) -> Job:
    """Move a job to status `to` and return the updated row.

    In one transaction: a single conditional `UPDATE … RETURNING` locks the row, checks the move
    against `Job.TRANSITIONS` (narrowed to `from_` when given, to the run `only_attempt` and
    to the extra condition `where` when given), writes the status with `fields` and the next
    event seq; then the `status` event is inserted. Leaving `processing` releases the run's
    lease, except for `cancelled`, where the run may still be winding down. `has_owner` (when
    the caller knows; an owner never changes) lets an ownerless job's move skip the transaction
    that its webhooks would need (see `_transition_transaction`). With `dispatch`,
    the job's Celery task is sent after the commit (after `countdown` seconds). Raises
    JobNotFound, or InvalidTransition naming the current status.
    """
    sources = _sources_for(to)
    if from_ is not None:
        sources &= set(from_)
    now = timezone.now()
    values: dict[str, Any] = {"status": to, "event_seq": F("event_seq") + 1, "updated_at": now}
    if to == Status.PROCESSING:
        values["started_at"] = now
    if to in Job.TERMINAL:
        values["finished_at"] = now
    elif to == Status.PENDING:
        values["finished_at"] = None
    if to not in (Status.PROCESSING, Status.CANCELLED):
        values["lease_expires_at"] = None
    values.update(fields or {})

    with _transition_transaction(to, has_owner):
        rows = Job.objects.filter(pk=job_id, status__in=sources)
        if only_attempt is not None:
            rows = rows.filter(attempts=only_attempt)
        if where is not None:
            rows = rows.filter(where)
        written = job_update_with_event(rows=rows, fields=values, type="status", status=to, message=message)
        if written is None:
            current = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
            if current is None:
                raise JobNotFound(f"job {job_id} does not exist")
            raise InvalidTransition(f"job {job_id} is {current}; it cannot move to {to}")
        job = written[0]
        if to in WEBHOOK_STATUSES and job.owner_id is not None:
            from webhooks.services import webhook_deliveries_enqueue

            # In this transaction: a committed status change always has its deliveries queued.
            webhook_deliveries_enqueue(job=job, event=to)
        if dispatch:
            transaction.on_commit(lambda: job_dispatch(job=job, countdown=countdown), robust=True)
    return job


def _transition_transaction(to: str, has_owner: bool | None) -> AbstractContextManager:
    """The transaction of one move. On PostgreSQL a move that writes nothing else (not a status
    webhooks are told about, or a job without an owner to tell) is ONE statement, the UPDATE and
    its event's INSERT as a CTE, and so atomic on its own: outside a caller's transaction it runs
    in autocommit and saves the BEGIN and COMMIT round trips (every claim, and the outcome of an
    ownerless job). Its after-commit work (the push, a dispatch) then runs right after the
    statement, as after a COMMIT."""
    connection = transaction.get_connection()
    alone = to not in WEBHOOK_STATUSES or has_owner is False
    if connection.vendor == "postgresql" and not connection.in_atomic_block and alone:
        return nullcontext()
    return transaction.atomic()


def job_dispatch(*, job: Job, countdown: float | None = None) -> None:
    """Send the Celery message that runs `job` (call it after the job's row is committed).

    The task shows in Flower under the job's kind (Celery's `shadow` name) with the job id as
    its argument.
    """
    from jobs.tasks import job_run

    options: dict[str, Any] = {"shadow": job.kind}
    try:
        job_kind = kind_get(job.kind)
    except UnknownKind:  # it still runs, and fails with a clear error there
        job_kind = None
    if job_kind is not None and job_kind.queue:
        options["queue"] = job_kind.queue
    if job_kind is not None and job_kind.time_limit:
        # Celery raises SoftTimeLimitExceeded in the handler (the runner records `timeout`);
        # the hard limit a minute later kills a run that swallowed it.
        options["soft_time_limit"] = job_kind.time_limit
        options["time_limit"] = job_kind.time_limit + 60
    if countdown:
        options["countdown"] = countdown
    job_run.apply_async(args=[str(job.pk)], **options)


def request_digest(*, kind: str, input: Any) -> str:
    """A stable digest of a submission, to tell a repeated request from a different one."""
    canonical = json.dumps({"kind": kind, "input": input}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_submit(
    *,
    kind: str,
    input: dict[str, Any] | None = None,
    owner: Any = None,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """Validate and create a `pending` job, dispatched once the transaction commits.

    Returns `(job, created)`. With an `idempotency_key` (scoped to `owner`), a repeat of the
    same request returns the existing job with `created=False`, and the same key with another
    kind or input raises IdempotencyConflict. Raises UnknownKind or InvalidInput (naming the
    field) for bad requests.
    """
    job_kind = kind_get(kind)
    input = {} if input is None else input
    job_kind.validate_input(input)
    owner_id = getattr(owner, "pk", owner)
    if idempotency_key is not None:
        existing = _job_for_idempotency_key(owner_id=owner_id, key=idempotency_key, kind=kind, input=input)
        if existing is not None:
            return existing, False
    max_attempts = _attempt_budget(kind)
    try:
        with transaction.atomic():
            job = Job.objects.create(
                kind=kind,
                input=input,
                owner_id=owner_id,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                event_seq=1,
            )
            event_record(job=job, type="status", status=Status.PENDING)
            transaction.on_commit(lambda: job_dispatch(job=job), robust=True)
    except IntegrityError:
        # Two identical requests raced; the unique constraint let one through.
        if idempotency_key is None:
            raise
        existing = _job_for_idempotency_key(owner_id=owner_id, key=idempotency_key, kind=kind, input=input)
        if existing is None:
            raise
        return existing, False
    return job, True


def jobs_submit_many(*, kind: str, inputs: list[dict[str, Any]], owner: Any = None) -> list[Job]:
    """Validate and create one `pending` job per input, in one transaction and three statements
    (the jobs, their first events), each dispatched once the transaction commits.

    For batches (`manage.py submit --count`, imports): a job costs a fraction of `job_submit`'s
    round trips. All or nothing: an invalid input raises InvalidInput naming its index
    (`inputs[3].amount: ...`) and no job is created. No idempotency keys here.
    """
    job_kind = kind_get(kind)
    for index, value in enumerate(inputs):
        try:
            job_kind.validate_input(value)
        except InvalidInput as exc:
            field = f"inputs[{index}]{exc.field.removeprefix('input')}"
            raise InvalidInput(f"{field}{exc.message.removeprefix(exc.field)}", field=field) from None
    owner_id = getattr(owner, "pk", owner)
    max_attempts = _attempt_budget(kind)
    with transaction.atomic():
        jobs = Job.objects.bulk_create(
            [Job(kind=kind, input=value, owner_id=owner_id, max_attempts=max_attempts, event_seq=1) for value in inputs]
        )
        events_record_first(jobs=jobs)
        for job in jobs:
            transaction.on_commit(partial(job_dispatch, job=job), robust=True)
    return jobs


def _attempt_budget(kind: str) -> int:
    try:
        configured = kind_get(kind).max_attempts
    except UnknownKind:
        configured = None
    return configured or settings.JOBS_DEFAULT_MAX_ATTEMPTS


def _job_for_idempotency_key(*, owner_id: Any, key: str, kind: str, input: Any) -> Job | None:
    job = Job.objects.filter(owner_id=owner_id, idempotency_key=key).first()
    if job is None:
        return None
    if request_digest(kind=job.kind, input=job.input) != request_digest(kind=kind, input=input):
        raise IdempotencyConflict(
            f"idempotency_key {key!r} was already used for job {job.pk} with a different kind or input; "
            "use a new key for a new job",
            field="idempotency_key",
        )
    return job


def job_claim(*, job_id: Any, worker: str = "", task_id: str = "") -> Job:
    """Claim a pending job for a run: `pending → processing`, counting the attempt and taking
    a lease (see `jobs.leases`) in the name of `worker` and its Celery `task_id`.

    One conditional UPDATE, so of two deliveries of the same message exactly one wins; the
    other gets InvalidTransition and must do nothing.
    """
    return job_transition(
        job_id=job_id,
        to=Status.PROCESSING,
        from_=[Status.PENDING],
        fields={
            "attempts": F("attempts") + 1,
            "lease_expires_at": lease_deadline(),
            "worker": worker[:200],
            "task_id": task_id[:64],
        },
    )


def job_hand_back(*, job: Job, reason: str) -> Job:
    """Give the run `job` back (its worker is shutting down): `processing → pending`, sent
    again at once. The run does not count against the attempts: the budget grows by one."""
    return job_transition(
        job_id=job.pk,
        to=Status.PENDING,
        from_=[Status.PROCESSING],
        only_attempt=job.attempts,
        fields={"max_attempts": F("max_attempts") + 1, "run_after": None},
        message={"handed_back": True, "reason": reason, "attempt": job.attempts},
        dispatch=True,
    )


def run_lease_release(*, job: Job) -> None:
    """A run that lost its job (cancelled, or taken back) has stopped: its lease is no longer
    a sign of life."""
    Job.objects.filter(pk=job.pk, attempts=job.attempts).exclude(status=Status.PROCESSING).update(
        lease_expires_at=None
    )


def job_complete(*, job: Job, result: Any) -> Job:
    """End the run `job` (as claimed) successfully with `result`."""
    return job_transition(
        job_id=job.pk,
        to=Status.COMPLETED,
        from_=[Status.PROCESSING],
        only_attempt=job.attempts,
        fields={"result": result, "error": None, "progress_fraction": 1.0},
        has_owner=job.owner_id is not None,
    )


def retry_delay(attempt: int) -> float:
    """Exponential back-off with jitter: half fixed, half random, capped."""
    ceiling = min(settings.JOBS_RETRY_BACKOFF_MAX, settings.JOBS_RETRY_BACKOFF_BASE * 2 ** max(attempt - 1, 0))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def job_fail(
    *, job: Job, code: str, message: str, retry: bool = True, record: Callable[[], None] | None = None,
    traceback: str = "",
) -> Job:
    """End the run `job` with an error: back to `pending` after a back-off while attempts
    remain (and `retry`), else `failed`. The error is recorded either way. `record` (from a
    `JobFailure`) writes what must commit with the failure, in the same transaction. A
    `traceback` is kept on the job's row for the admin only, never in its events (see
    `jobs.presenters.job_error_public`)."""
    if record is not None:
        with transaction.atomic():
            record()
            return job_fail(job=job, code=code, message=message, retry=retry, traceback=traceback)
    error = {"code": code, "message": message[:2000]}
    stored = {**error, "traceback": traceback[:8000]} if traceback else error
    if retry and job.attempts < job.max_attempts:
        delay = retry_delay(job.attempts)
        return job_transition(
            job_id=job.pk,
            to=Status.PENDING,
            from_=[Status.PROCESSING],
            only_attempt=job.attempts,
            fields={"error": stored, "run_after": timezone.now() + timedelta(seconds=delay)},
            message={"error": error, "retry_in": round(delay, 3), "attempt": job.attempts},
            dispatch=True,
            countdown=delay,
        )
    return job_transition(
        job_id=job.pk,
        to=Status.FAILED,
        from_=[Status.PROCESSING],
        only_attempt=job.attempts,
        fields={"error": stored},
        message={"error": error},
        has_owner=job.owner_id is not None,
    )


def job_pause(*, job: Job, question: dict[str, Any]) -> Job:
    """Park the run `job` on a question for a person: open the question (unless it is already
    open) and move `processing → paused`, in one transaction. The worker slot is freed."""
    from approvals.services import question_open

    with transaction.atomic():
        question_open(job=job, **question)
        return job_transition(
            job_id=job.pk,
            to=Status.PAUSED,
            from_=[Status.PROCESSING],
            only_attempt=job.attempts,
            message={"question": question["key"]},
        )


def job_park(*, job: Job, apply: Callable[[], bool], message: dict[str, Any] | None = None) -> Job:
    """Park the run `job` on external work (`ctx.wait_for`): `processing → waiting`, in the
    transaction in which `apply()` writes the wait's row (its next due time). The worker slot is
    freed; beat or a callback resumes the job. When `apply()` reports that the wait is already
    due (its callback came while this run was still going), the job is resumed at once."""
    with transaction.atomic():
        due_now = apply()
        job = job_transition(
            job_id=job.pk, to=Status.WAITING, from_=[Status.PROCESSING], only_attempt=job.attempts, message=message
        )
        if due_now:
            job = job_resume(job_id=job.pk, reason={**(message or {}), "by": "callback"})
    return job


def job_resume(*, job_id: Any, reason: dict[str, Any] | None = None) -> Job:
    """Make a paused or waiting job runnable again (`→ pending`) and dispatch it."""
    return job_transition(
        job_id=job_id,
        to=Status.PENDING,
        from_=[Status.PAUSED, Status.WAITING],
        fields={"run_after": None},
        message=reason,
        dispatch=True,
    )


def job_cancel(*, job_id: Any, actor: Any = None, channel: str | None = None) -> Job:
    """Cancel a job that has not finished, closing its open questions (each with a row in the
    decision ledger naming `actor` and the `channel`: admin, api, web or system) and its
    active waits on external work.

    A running job stops at its next `ctx` call (its writes are fenced to the run that owns
    it), so a cancelled job never turns `completed` afterwards.
    """
    from approvals.services import questions_cancel_for_job
    from waits.services import waits_cancel_for_job

    with transaction.atomic():
        job = job_transition(
            job_id=job_id,
            to=Status.CANCELLED,
            from_=[Status.PENDING, Status.PROCESSING, Status.PAUSED, Status.WAITING],
            message={"by": getattr(actor, "username", None)},
        )
        questions_cancel_for_job(job=job, actor=actor, channel=channel)
        waits_cancel_for_job(job=job, actor=actor)
    return job


def job_retry(*, job_id: Any, actor: Any = None) -> Job:
    """Run a failed or cancelled job again, with a fresh budget of attempts.

    Finished steps stay checkpointed and answered questions stay answered, so the new run
    picks up where the last one stopped. `attempts` keeps counting (it fences each run's
    writes, so a cancelled run that is still winding down can never write into the new one);
    the budget grows instead.
    """
    kind = Job.objects.filter(pk=job_id).values_list("kind", flat=True).first()
    if kind is None:
        raise JobNotFound(f"job {job_id} does not exist")
    return job_transition(
        job_id=job_id,
        to=Status.PENDING,
        from_=[Status.FAILED, Status.CANCELLED],
        fields={
            "max_attempts": F("attempts") + _attempt_budget(kind),
            "error": None,
            "result": None,
            "run_after": None,
        },
        message={"by": getattr(actor, "username", None), "retry": True},
        dispatch=True,
    )


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
            job_dispatch(job=job)
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
    from taskplatform.celery import app

    now = timezone.now()
    alive = Job.objects.filter(
        status=Status.CANCELLED, lease_expires_at__gt=now, finished_at__lt=now - timedelta(seconds=grace)
    ).exclude(task_id="").only("pk", "task_id", "attempts", "lease_expires_at")[:limit]
    revoked = 0
    for job in alive:
        app.control.revoke(job.task_id, terminate=True, signal="SIGKILL")
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
