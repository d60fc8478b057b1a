"""The named moves of a job, each a `job_transition` that refuses a wrong source status:
claim, hand back, complete, fail (or retry), suspend (pause or park), resume, wake, cancel,
retry by hand."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from dbkit.kept import KeptRead
from jobs.backoff import backoff_with_jitter
from jobs.clock import db_now, db_now_plus
from jobs.conflicts import retry_on_conflict
from jobs.errors import ClaimDeferred, InvalidTransition, JobNotFound
from jobs.events import EarlierEvent, RunLost
from jobs.leases import lease_deadline
from jobs.models import Job, status_among
from jobs.services import family, transitions
from jobs.services.submitting import attempt_budget
from jobs.services.transitions import job_transition
from jobs.storable import storable_text

Status = Job.Status


def job_claim(*, job_id: Any, worker: str = "", task_id: str = "") -> Job:
    """Claim a pending job for a run: `pending → processing`, counting the attempt and taking
    a lease (see `jobs.leases`) in the name of `worker` and its Celery `task_id`.

    One conditional UPDATE, so of two deliveries of the same message exactly one wins; the
    other gets InvalidTransition and must do nothing. A job in its retry back-off (`run_after`
    still ahead: an early duplicate message) is not claimed, nor one whose earlier run still
    holds a live lease (a cancelled run winding down when the job was retried: no two runs of a
    job ever overlap). Then ClaimDeferred says when to try again. Both are judged by the
    database's clock (`jobs.clock`), as every lease and due time is written with it.
    """
    try:
        return job_transition(
            job_id=job_id,
            to=Status.PROCESSING,
            from_=_FROM_PENDING,
            where=_claimable(db_now()),
            fields={
                "attempts": _NEXT_ATTEMPT,
                "lease_expires_at": lease_deadline(),
                "worker": worker[:200],
                "task_id": task_id[:64],
            },
        )
    except InvalidTransition as exc:
        current = Job.objects.filter(pk=job_id).annotate(now=db_now()).values(
            "status", "kind", "lease_expires_at", "run_after", "now").first()
        if current is None or current["status"] != Status.PENDING:
            raise
        lease, run_after, now = current["lease_expires_at"], current["run_after"], current["now"]
        if lease is not None and lease >= now:
            raise ClaimDeferred(
                f"job {job_id}: its previous run is still stopping (lease until {lease:%H:%M:%S})",
                retry_in=(lease - now).total_seconds() + 0.1, kind=current["kind"],
            ) from exc
        if run_after is not None and run_after > now:
            raise ClaimDeferred(
                f"job {job_id}: its retry back-off runs until {run_after:%H:%M:%S}",
                retry_in=(run_after - now).total_seconds(), kind=current["kind"],
            ) from exc
        raise


_FROM_PENDING = (Status.PENDING,)
_NEXT_ATTEMPT = F("attempts") + 1
_claimable_last: tuple[Any, Q | None] = (None, None)  # (now, its condition): one object while the clock stands


def _claimable(now: Any) -> Q:
    """A job a run may claim now: no live lease of an earlier run, and past its back-off. The
    same condition object while `now` is (`jobs.clock`), so a claim's statement shape is worked
    out once (`jobs.statements`)."""
    global _claimable_last
    last_now, condition = _claimable_last
    if last_now is not now or condition is None:
        condition = ((Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
                     & (Q(run_after__isnull=True) | Q(run_after__lte=now)))
        _claimable_last = (now, condition)
    return condition


def job_hand_back(*, job: Job, reason: str) -> Job:
    """Give the run `job` back (its worker is shutting down, its database went away):
    `processing → pending`, to go on from its last finished step in another run. The run does
    not count against the attempts (the budget grows by one), JOBS_HAND_BACK_BUDGET times per
    job: the first hand-back is sent again at once, each later one after a back-off, and past
    the budget a hand-back is an ordinary failed attempt (`too_many_hand_backs`), so a job that
    is handed back again and again still ends."""
    hand_backs = job.hand_backs + 1
    if hand_backs > settings.JOBS_HAND_BACK_BUDGET:
        return job_fail(
            job=job, code="too_many_hand_backs",
            message=f"the run was handed back ({reason}) after {job.hand_backs} hand-backs already, the budget "
            f"(JOBS_HAND_BACK_BUDGET); this one counts as a failed attempt",
        )
    delay = retry_delay(hand_backs - 1) if hand_backs > 1 else 0.0
    return job_transition(
        job_id=job.pk,
        to=Status.PENDING,
        from_=[Status.PROCESSING],
        only_attempt=job.attempts,
        fields={
            "max_attempts": F("max_attempts") + 1,
            "hand_backs": F("hand_backs") + 1,
            "run_after": db_now_plus(delay) if delay else None,
        },
        message={"handed_back": True, "reason": reason, "attempt": job.attempts, "hand_backs": hand_backs,
                 **({"retry_in": round(delay, 3)} if delay else {})},
        dispatch=True,
        countdown=delay or None,
    )


def job_lock(*, job_id: Any) -> bool:
    """Lock the job's row in the caller's transaction (False: there is no such job).

    The platform's one lock order: a service that writes a job's questions or waits locks the
    job's row first, as every status move does (`job_transition`'s UPDATE, then the transition
    hooks), so two services never wait for each other in opposite orders (a deadlock).
    Precondition: inside `transaction.atomic`.
    """
    return bool(_JOB_LOCK.rows(job_id, using=Job.objects.db))


# Built once per connection (dbkit.kept): every answer and every cancel takes this lock.
_JOB_LOCK = KeptRead(lambda job_id: Job.objects.select_for_update().filter(pk=job_id).order_by().values_list("pk"),
                     stand_ins=(uuid.UUID(int=0),))


def run_lock(*, job_id: Any, attempt: int) -> None:
    """Lock the job's row for the run `attempt` in the caller's transaction, or raise `RunLost`
    when that run no longer owns the job (cancelled, taken back, handed to another run); mark
    the job as holding feature rows (`Job.feature_rows`: they close when it finishes).

    For a feature's writes that come before something leaves the platform (a submit to another
    service): made under the job's row lock, they cannot slip in after a cancellation (which
    takes that lock first) nor be made by a stale run. Precondition: inside `transaction.atomic`.
    One statement: the UPDATE takes the lock.
    """
    if not Job.objects.filter(status_among([Status.PROCESSING]), pk=job_id, attempts=attempt).update(
            feature_rows=True):
        raise RunLost(f"job {job_id} is no longer run by attempt {attempt}")


def run_lease_release(*, job: Job) -> None:
    """A run that lost its job (cancelled, or taken back) has stopped: its lease is no longer
    a sign of life. A job retried meanwhile was waiting for exactly that (see `job_claim`): it is
    sent again now."""
    with transaction.atomic():
        released = Job.objects.filter(pk=job.pk, attempts=job.attempts, lease_expires_at__isnull=False).exclude(
            status=Status.PROCESSING
        ).update_returning(lease_expires_at=None)
        if released is not None and released.status == Status.PENDING:
            transaction.on_commit(lambda: transitions.job_dispatch(job=released), robust=True)


def job_complete(*, job: Job, result: Any) -> Job:
    """End the run `job` (as claimed) successfully with `result`."""
    return job_transition(
        job_id=job.pk,
        to=Status.COMPLETED,
        from_=[Status.PROCESSING],
        only_attempt=job.attempts,
        fields={"result": result, "error": None, "progress_fraction": 1.0},
        has_owner=job.owner_id is not None,
        has_parent=job.parent_id is not None,
    )


def retry_delay(attempt: int) -> float:
    """The back-off before automatic retry number `attempt` (JOBS_RETRY_BACKOFF_BASE doubling
    per attempt, capped at JOBS_RETRY_BACKOFF_MAX, with jitter)."""
    return backoff_with_jitter(attempt, base=settings.JOBS_RETRY_BACKOFF_BASE, cap=settings.JOBS_RETRY_BACKOFF_MAX)


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
    error = {"code": code, "message": storable_text(message)[:2000]}
    stored = {**error, "traceback": storable_text(traceback)[:8000]} if traceback else error
    if retry and job.attempts < job.max_attempts:
        delay = retry_delay(job.attempts)
        return job_transition(
            job_id=job.pk,
            to=Status.PENDING,
            from_=[Status.PROCESSING],
            only_attempt=job.attempts,
            fields={"error": stored, "run_after": db_now_plus(delay)},
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
        has_parent=job.parent_id is not None,
    )


def job_suspend(
    *, job: Job, to: str, apply: Callable[[Job], bool | None], message: dict[str, Any] | None = None, on: str = ""
) -> Job:
    """Stop the run `job` without finishing it (`processing → paused` for a person, or
    `→ waiting` for an outside event), in the transaction in which `apply(job)` writes the
    feature's own rows (the question, the wait). The worker slot is freed. `on` names what the
    job is suspended on (`Job.suspended_on`): a wake that names something else does not resume it.

    The job's row is locked first (the one lock order of the platform: the job, then its
    questions and waits). When `apply` returns True, what the job waits for already came while
    the run was still going (a callback raced the park): the job is made runnable at once, so
    that wake is never lost.
    """
    if to not in (Status.PAUSED, Status.WAITING):
        raise ValueError(f"a run suspends into paused or waiting, not {to}")
    with transaction.atomic():
        job_lock(job_id=job.pk)
        due_now = apply(job)
        suspended = job_transition(
            job_id=job.pk, to=to, from_=[Status.PROCESSING], only_attempt=job.attempts, message=message,
            fields={"suspended_on": on[:250], "feature_rows": True},
        )
        if due_now:
            suspended = job_transition(
                job_id=job.pk, to=Status.PENDING, from_=[to], fields={"run_after": None},
                message={**(message or {}), "by": "callback"}, dispatch=True,
            )
    return suspended


def job_resume(*, job_id: Any, reason: dict[str, Any] | None = None, on: str | None = None,
               before: EarlierEvent | None = None) -> Job:
    """Make a job `paused` on a question runnable again (`paused → pending`: it was answered)
    and dispatch it. With `on`, only if the job is suspended on that (`question:<key>`).
    `before`: the event that says why (the question's answer), written with the move's own
    (`job_transition`)."""
    return job_transition(
        job_id=job_id, to=Status.PENDING, from_=[Status.PAUSED], fields={"run_after": None}, message=reason,
        dispatch=True, suspended_on=on, before=before,
    )


def job_wake(*, job_id: Any, on: str, reason: dict[str, Any] | None = None,
             before: EarlierEvent | None = None) -> Job:
    """Make a job `waiting` on outside work runnable again (`waiting → pending`: a callback, a
    due check or a person woke it) and dispatch it, only if it is waiting on `on` (the wait that
    woke, `wait:<key>`). A paused job, or one that has parked on another wait since, is never
    woken this way (InvalidTransition: nothing is written, `before` neither). `before`: the
    event that says why, written with the move's own (`job_transition`)."""
    return job_transition(
        job_id=job_id, to=Status.PENDING, from_=[Status.WAITING], fields={"run_after": None}, message=reason,
        dispatch=True, suspended_on=on, before=before,
    )


def job_fail_suspended(*, job_id: Any, code: str, message: str, from_: list[str] | None = None) -> Job:
    """Fail a job that is not running (`paused` or `waiting` → `failed`) with the error `code`:
    what it waited for will not come (a question's deadline passed with the policy Fail)."""
    error = {"code": code, "message": message[:2000]}
    return job_transition(
        job_id=job_id, to=Status.FAILED, from_=from_ or [Status.PAUSED, Status.WAITING], fields={"error": error},
        message={"error": error},
    )


@retry_on_conflict
def job_cancel(*, job_id: Any, actor: Any = None, channel: str | None = None) -> Job:
    """Cancel a job that has not finished. In the same transaction the feature apps' hooks close
    what the job was waiting for (its open questions, each with a row in the decision ledger
    naming `actor` and the `channel`: admin, api, web or system; its active waits).

    A running job stops at its next `ctx` call (its writes are fenced to the run that owns
    it), so a cancelled job never turns `completed` afterwards. Its unfinished child jobs (and
    theirs) are cancelled with it, in the same transaction.
    """
    with transaction.atomic():
        descendants = family.descendants_lock(job_id=job_id, statuses=family.UNFINISHED)  # deeper rows first
        job = job_transition(
            job_id=job_id,
            to=Status.CANCELLED,
            from_=[Status.PENDING, Status.PROCESSING, Status.PAUSED, Status.WAITING],
            message={"by": getattr(actor, "username", None)},
            actor=actor,
            channel=channel,
        )
        family.descendants_cancel(rows=descendants, actor=actor, channel=channel)
    return job


@retry_on_conflict
def job_retry(*, job_id: Any, actor: Any = None) -> Job:
    """Run a failed or cancelled job again, with a fresh budget of attempts.

    Finished steps stay checkpointed and answered questions stay answered, so the new run
    picks up where the last one stopped. `attempts` keeps counting (it fences each run's
    writes, so a cancelled run that is still winding down can never write into the new one);
    the budget grows instead. Its failed and cancelled child jobs (and theirs) are retried with
    it, so that its new run finds them running again.
    """
    kind = Job.objects.filter(pk=job_id).values_list("kind", flat=True).first()
    if kind is None:
        raise JobNotFound(f"job {job_id} does not exist")
    with transaction.atomic():
        descendants = family.descendants_lock(job_id=job_id, statuses=family.RETRYABLE)  # deeper rows first
        job = job_transition(
            job_id=job_id,
            to=Status.PENDING,
            from_=[Status.FAILED, Status.CANCELLED],
            fields={
                "max_attempts": F("attempts") + attempt_budget(kind),
                "hand_backs": 0,
                "error": None,
                "result": None,
                "run_after": None,
                # A cancelled run may still be winding down: its lease (no longer renewed, as the job
                # is not `cancelled` any more) keeps the next run from starting beside it.
                "lease_expires_at": F("lease_expires_at"),
            },
            message={"by": getattr(actor, "username", None), "retry": True},
            dispatch=True,
        )
        family.descendants_retry(rows=descendants, actor=actor)
    return job

