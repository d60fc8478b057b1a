"""Every write to a wait goes through here: open, run bookkeeping, park, finish, wake, look now,
cancel. The job's own moves (`processing → waiting`, `waiting → pending`) stay in
`jobs.services`; these functions call them in the same transaction as the wait row's update.
A cancelled job's waits close through a transition hook (`waits.extensions`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.urls import reverse

from dbkit.kept import KeptRead
from jobs.clock import database_now, db_now
from jobs.conflicts import retry_on_conflict
from jobs.errors import InvalidTransition
from jobs.events import event_append
from jobs.models import Job
from jobs.services import job_cancel, job_lock, job_wake, run_lock
from waits.errors import WaitNotActive, WakeTokenInvalid
from waits.ledger import wait_decision_record
from waits.models import Wait, WaitDecision
from waits.policy import WaitPolicy
from waits.selectors import waits_due

logger = logging.getLogger(__name__)

Event = tuple[str, dict[str, Any]]  # (wait event status, message)


def wait_suspension(key: str) -> str:
    """What a job parked on the wait `key` is suspended on (`Job.suspended_on`)."""
    return f"wait:{key}"


# -- tokens -----------------------------------------------------------------------------------
def wake_token(salt: str) -> str:
    """The wake token of a wait: HMAC-SHA256 of its salt under SECRET_KEY, URL-safe.

    Derived rather than stored, so that every retry of a submit (in any process, after any
    restart) hands the service the same token, which doubles as its idempotency key, while the
    database holds only the salt and the token's hash.
    """
    mac = hmac.new(settings.SECRET_KEY.encode(), f"waits.wake:{salt}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def wake_token_hash(token: str) -> str:
    """SHA-256 of a token, hex: the only form a token is stored in."""
    return hashlib.sha256(token.encode()).hexdigest()


def wake_url(token: str) -> str:
    """The callback URL the service is given: PUBLIC_URL + /api/wake/{token}/."""
    return settings.PUBLIC_URL + reverse("wait-wake", args=[token])


def token_fields_fresh() -> dict[str, Any]:
    """A new salt, and the hash of the token it makes: a wait's token, minted or minted again."""
    salt = secrets.token_hex(16)
    return {"token_salt": salt, "token_hash": wake_token_hash(wake_token(salt)), "token_used_at": None}


# -- what a run does --------------------------------------------------------------------------
def wait_open(*, job_id: Any, key: str, service: str, policy: WaitPolicy, run_attempt: int,
              person: dict[str, Any] | None = None) -> Wait:
    """The job's wait `key`, created (with its token minted) on first use.

    `person` (from `waits.people.person_spec_build`) makes it a combined wait: what a person is
    shown, who may act, and the one deadline (`timeout` seconds from now) with its policy.
    A wait that failed or was cancelled starts again from scratch with a new token and a fresh
    deadline: the job is being run again because a person retried it. Fenced to the run
    `run_attempt` under the job's row lock (`RunLost` when it no longer owns the job): a
    cancelled or stale run never leaves an active wait behind.
    """
    with transaction.atomic():
        run_lock(job_id=job_id, attempt=run_attempt)
        return _wait_open(job_id=job_id, key=key, service=service, policy=policy, person=person)


def _wait_open(*, job_id: Any, key: str, service: str, policy: WaitPolicy, person: dict[str, Any] | None) -> Wait:
    wait = Wait.objects.filter(job_id=job_id, key=key).first()
    mode = Wait.Mode.CALLBACK if policy.callback else Wait.Mode.POLL
    if wait is None:
        try:
            with transaction.atomic():
                wait = Wait.objects.create(
                    job_id=job_id, key=key, service=service, mode=mode, policy=policy.as_dict(),
                    **token_fields_fresh(), **_person_fields(person),
                )
                _person_assign(wait, person)
                return wait
        except IntegrityError:  # a duplicate delivery of the same run raced us to it
            return Wait.objects.get(job_id=job_id, key=key)
    if wait.state in (Wait.State.FAILED, Wait.State.CANCELLED):
        fields = {
            **token_fields_fresh(), "state": Wait.State.SUBMITTING, "service": service, "mode": mode,
            "policy": policy.as_dict(), "external_id": "", "woken_at": None, "checks": 0, "throttle_bounces": 0,
            "transport_failures": 0, "transport_failures_total": 0, "executions": 0, "accepted_at": None,
            "next_due_at": None, "deadline_at": None, "last_checked_at": None, "result": None, "error": None,
            "woken_by": "", "ended_by": "", "ended_at": None, **_person_fields(person),
            "updated_at": db_now(),
        }
        with transaction.atomic():
            Wait.objects.filter(pk=wait.pk).update(**fields)
            _person_assign(wait, person)
        wait.refresh_from_db()
    return wait


def _person_fields(person: dict[str, Any] | None) -> dict[str, Any]:
    if person is None:
        return {"person": None, "on_timeout": None}
    timeout = person.get("timeout")
    return {
        "person": person["person"], "on_timeout": person.get("on_timeout"),
        "deadline_at": database_now() + timedelta(seconds=timeout) if timeout else None,
    }


def _person_assign(wait: Wait, person: dict[str, Any] | None) -> None:
    assignees = (person or {}).get("assignees") or {}
    wait.assigned_users.set(assignees.get("users") or [])
    wait.assigned_groups.set(assignees.get("groups") or [])


def wait_execution_begin(*, wait: Wait, run_attempt: int) -> Wait:
    """Count one more run through the wait and consume a pending wake (this run will look). The
    returned wait's `woken_by` says what woke this run ("callback", "admin", "person"; "" for a
    due mark or the first run), so that the check can say which channel ended it. Fenced to the
    run `run_attempt` (`RunLost`): a stale run cannot consume the live run's wake."""
    wait_id = wait.pk
    with transaction.atomic():
        run_lock(job_id=wait.job_id, attempt=run_attempt)  # the job's row first
        woken_by = Wait.objects.select_for_update().filter(pk=wait_id).values_list("woken_by", flat=True).get()
        Wait.objects.filter(pk=wait_id).update(executions=F("executions") + 1, woken_at=None, woken_by="",
                                               updated_at=db_now())
    wait = Wait.objects.get(pk=wait_id)
    wait.woken_by = woken_by
    return wait


def wait_update(*, wait: Wait, fields: dict[str, Any], events: list[Event], run_attempt: int,
                decision: dict[str, Any] | None = None) -> None:
    """Write `fields` of the wait and its `wait` events in one transaction, fenced to the run
    (the first event takes the job's row lock), with `decision` (the keyword arguments of
    `wait_decision_record`) as a row of the wait's ledger when the run ends the wait."""
    with transaction.atomic():
        for status, message in events:
            event_append(job_id=wait.job_id, type="wait", step=wait.key, status=status, message=message,
                         run_attempt=run_attempt)
        Wait.objects.filter(pk=wait.pk).update(**fields, updated_at=db_now())
        if decision is not None:
            wait_decision_record(wait=wait, **decision)


def wait_park_apply(*, wait: Wait, fields: dict[str, Any], events: list[Event], run_attempt: int) -> bool:
    """Record the wait's next due time as the job parks (called by `jobs.services.job_suspend`, in
    its transaction). Returns True when a wake arrived while the run was still going: the wait is
    then due now and the job is resumed at once, so no callback is ever lost to that race."""
    with transaction.atomic():
        woken_at = Wait.objects.select_for_update().filter(pk=wait.pk).values_list("woken_at", flat=True).first()
        due_now = woken_at is not None
        if due_now:
            fields = {**fields, "next_due_at": db_now()}
        wait_update(wait=wait, fields=fields, events=events, run_attempt=run_attempt)
    return due_now


def wait_fail_apply(*, wait: Wait, code: str, message: str, fields: dict[str, Any], events: list[Event],
                    run_attempt: int, channel: str = "system") -> None:
    """Mark the wait failed (called by `jobs.services.job_fail`, in the job's failing transaction);
    `channel` is what ended it (`check`: the service said it failed; `deadline`: still pending at
    the last mark; `system`: a budget spent)."""
    fields = {**fields, "state": Wait.State.FAILED, "error": {"code": code, "message": message},
              "next_due_at": None, "ended_by": channel, "ended_at": db_now()}
    events = [*events, ("failed", {"code": code, "message": message, "by": channel})]
    wait_update(wait=wait, fields=fields, events=events, run_attempt=run_attempt,
                decision={"kind": WaitDecision.Kind.FAILED, "channel": channel, "comment": message,
                          "detail": {"code": code}})


# -- what wakes a wait ------------------------------------------------------------------------
def _wake(*, wait: Wait, by: str, message: dict[str, Any] | None = None, token_used: bool = False) -> None:
    """Caller holds the job's row lock, then the wait's, inside a transaction. `token_used`: the
    wake token is spent by this wake (one UPDATE of the wait's row for both)."""
    now = db_now()
    spent = {"token_used_at": now} if token_used else {}
    Wait.objects.filter(pk=wait.pk).update(woken_at=now, woken_by=by, next_due_at=now, updated_at=now, **spent)
    woken = ("wait", wait.key, "woken", {"by": by, **(message or {})})
    try:
        # The wait's event and the job's move to `pending` in one statement (`job_transition`'s `before`).
        job_wake(job_id=wait.job_id, on=wait_suspension(wait.key), reason={"wait": wait.key, "by": by}, before=woken)
    except InvalidTransition:
        # The run has not parked yet (the service called back at once), or a look is already
        # on its way: the run finds `woken_at` when it parks and resumes at once. Or the job
        # is not parked on this wait at all (paused on a question, parked on another wait):
        # it is not resumed. The refused move wrote nothing: the wake's event on its own.
        type_, step, status, said = woken
        event_append(job_id=wait.job_id, type=type_, step=step, status=status, message=said)


# A callback's two reads by its token's hash (unique), built once per connection (dbkit.kept): their
# ORM building was a quarter of a wake's CPU. The stand-in is no token's hash (not hexadecimal).
_STAND_IN_HASH = "stand-in: no token's hash"
_JOB_OF_TOKEN = KeptRead(lambda digest: Wait.objects.filter(token_hash=digest).order_by().values_list("job_id"),
                         stand_ins=(_STAND_IN_HASH,))
_LOCKED_BY_TOKEN = KeptRead(
    lambda digest: Wait.objects.select_for_update(of=("self",)).select_related("job").filter(token_hash=digest)
    .order_by(),
    stand_ins=(_STAND_IN_HASH,),
)


@retry_on_conflict
def wake_token_redeem(*, token: str) -> Wait:
    """Take a callback: make the wait due now and resume its job. Usable once.

    The callback is a signal, not a payload: the woken job collects the result through `check`,
    so a forged or replayed callback can at worst cause one early check. Raises WakeTokenInvalid
    (the same for an unknown, used or expired token).
    """
    digest = wake_token_hash(token)
    found = _JOB_OF_TOKEN.rows(digest, using=Wait.objects.db)
    job_id = found[0][0] if found else None
    with transaction.atomic():
        if job_id is not None:  # the job's row first, as every path that wakes or ends a wait
            job_lock(job_id=job_id)
        locked = _LOCKED_BY_TOKEN.rows(digest, using=Wait.objects.db)
        wait = locked[0] if locked else None
        usable = (
            wait is not None
            and hmac.compare_digest(wait.token_hash, digest)
            and wait.token_used_at is None
            and wait.is_active
            and wait.job.status not in Job.TERMINAL
        )
        if not usable:
            if wait is not None and wait.ended_by and hmac.compare_digest(wait.token_hash, digest):
                # The caller holds the real token: tell it what came first.
                raise WakeTokenInvalid(f"this wait already ended: {wait_ended_text(wait)}")
            raise WakeTokenInvalid("unknown, used or expired wake token")
        _wake(wait=wait, by="callback", token_used=True)
    return wait


def waits_resume_due(*, limit: int = 500) -> int:
    """Run by beat: resume the parked job of every active wait whose next look is due (a backup
    mark, a poll, the end of a Retry-After or of a transport back-off). Returns how many."""
    resumed = 0
    for _wait_id, job_id, key in waits_due(limit=limit):
        try:
            _resume_due(job_id=job_id, key=key)
        except InvalidTransition:
            continue  # it moved meanwhile (cancelled, or a callback resumed it)
        resumed += 1
    return resumed


@retry_on_conflict
def _resume_due(*, job_id: Any, key: str) -> None:
    with transaction.atomic():
        event_append(job_id=job_id, type="wait", step=key, status="woken", message={"by": "schedule"})
        job_wake(job_id=job_id, on=wait_suspension(key), reason={"wait": key, "by": "schedule"})


@retry_on_conflict
def wait_check_now(*, wait_id: int, actor: Any = None) -> Wait:
    """A person asks for a look now (from the admin): the wait is due at once and its job resumes."""
    with transaction.atomic():
        _lock_the_job_of(wait_id)
        wait = Wait.objects.select_for_update().filter(pk=wait_id).first()
        if wait is None or not wait.is_active:
            raise WaitNotActive(f"wait {wait_id} has finished; there is nothing to check")
        _wake(wait=wait, by="admin", message={"user": getattr(actor, "username", None)})
    return wait


@retry_on_conflict
def wait_cancel(*, wait_id: int, actor: Any = None) -> Wait:
    """A person gives up on the external work: its job is cancelled, which closes the wait."""
    with transaction.atomic():
        _lock_the_job_of(wait_id)
        wait = Wait.objects.select_for_update().filter(pk=wait_id).first()
        if wait is None or not wait.is_active:
            raise WaitNotActive(f"wait {wait_id} has finished; there is nothing to cancel")
        job_cancel(job_id=wait.job_id, actor=actor, channel="admin")
    wait.refresh_from_db()
    return wait


def _lock_the_job_of(wait_id: int) -> None:
    """The job's row first, then the wait: the platform's one lock order (a cancel locks the
    job, then its waits). Caller is in a transaction."""
    job_id = Wait.objects.filter(pk=wait_id).values_list("job_id", flat=True).first()
    if job_id is not None:
        job_lock(job_id=job_id)


def waits_cancel_for_job(*, job: Any, actor: Any = None, to: str = Job.Status.CANCELLED) -> int:
    """Close the active waits of `job` (it was cancelled, or ended with status `to` without
    coming back to them); a later callback finds no token.

    Precondition: the caller holds the transaction that ends the job.
    """
    closed = 0
    if to == Job.Status.CANCELLED:
        error = {"code": "cancelled", "message": f"cancelled by {getattr(actor, 'username', None) or 'the system'}"}
    else:
        error = {"code": "abandoned", "message": f"the job ended ({to}) without coming back to this wait"}
    for wait in Wait.objects.select_for_update().filter(job_id=job.pk, state__in=Wait.ACTIVE):
        now = db_now()
        Wait.objects.filter(pk=wait.pk).update(
            state=Wait.State.CANCELLED, next_due_at=None, updated_at=now, ended_by=WaitDecision.Channel.SYSTEM,
            ended_at=now, error=error,
        )
        event_append(job_id=job.pk, type="wait", step=wait.key, status="failed",
                     message={"code": error["code"], "by": getattr(actor, "username", None)})
        wait_decision_record(wait=wait, kind=WaitDecision.Kind.CANCELLED, channel=WaitDecision.Channel.SYSTEM,
                             actor=actor, comment="the job was cancelled" if to == Job.Status.CANCELLED
                             else f"the job ended ({to})")
        closed += 1
    return closed


def wait_ended_text(wait: Wait) -> str:
    """What ended `wait`, in words: for the loser of a race."""
    row = wait.decisions.exclude(kind=WaitDecision.Kind.REFUSED).order_by("-id").first()
    when = f" at {wait.ended_at:%Y-%m-%d %H:%M:%S} UTC" if wait.ended_at else ""
    if row is None:
        return f"{wait.state} ({wait.ended_by or 'system'}){when}"
    if row.channel == WaitDecision.Channel.PERSON:
        what = {"provided": "provided the result", "failed": "failed it"}.get(row.kind, row.kind)
        return f"{row.actor_name} {what}{when}"
    if row.channel == WaitDecision.Channel.CALLBACK:
        return f"the service called back and its result was collected{when}"
    if row.channel == WaitDecision.Channel.CHECK:
        return f"a check found the service's result{when}" if row.kind == "succeeded" else \
            f"a check found the service failed{when}"
    if row.channel == WaitDecision.Channel.DEADLINE:
        return f"its deadline passed ({row.kind}){when}"
    return f"{row.kind} ({row.comment or row.channel}){when}"
