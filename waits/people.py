"""The person channel and the one deadline of a combined wait
(`ctx.wait_for(..., person=Person(...), timeout=..., on_timeout=...)`).

A combined wait ends with whichever comes first: the callback (then the check that collects the
result), a backup check or a poll, a person (provide the result, retry the submit, fail the
wait), or the deadline's policy. Every path takes the job's row lock first, then the wait's, and
acts only while the job is parked on the wait (`waiting`): so of a callback, a person and beat
arriving together, exactly one moves the job on (one `status` event into `pending`, or into
`failed` / `cancelled`), and each other is told what came first (a person by `WaitEnded` or
`WaitBusy`, with a `refused` row in the wait's ledger; a callback by a 404 naming it).

Who may act is the rule of questions: the `approvals.answer_question` permission, one of the
wait's assignees (directly or through a group; superusers always), and not the job's submitter
unless its kind allows self-approval.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from approvals.policies import assignee_list, seconds_of
from approvals.selectors import ANSWER_PERMISSION, kinds_allowing_self_approval
from approvals.services.asking import assignees_resolve, deadline_policy_json
from jobs.clock import database_now, db_now
from jobs.errors import InvalidTransition
from jobs.events import event_append
from jobs.models import Job
from jobs.runtime import JobFailure
from jobs.services import job_cancel, job_fail_suspended, job_wake
from jobs.timestamps import iso_utc
from waits.errors import InvalidResult, NotAllowedToAct, WaitBusy, WaitEnded, WaitNotFound
from waits.ledger import wait_decision_record
from waits.models import Wait, WaitDecision
from waits.policy import Person
from waits.services import token_fields_fresh, wait_ended_text, wait_suspension

logger = logging.getLogger(__name__)

Kind = WaitDecision.Kind
Channel = WaitDecision.Channel


def _invalid(message: str) -> JobFailure:
    return JobFailure("invalid_wait", message)


# -- what the job author passes -----------------------------------------------------------------
def person_spec_build(*, key: str, person: Person | None, timeout: Any, on_timeout: Any) -> dict[str, Any] | None:
    """Check the person channel and the deadline of `ctx.wait_for` and return them as stored
    (`waits.services.wait_open`); None for a wait on the service alone.

    A mistake is the author's bug and fails the job at once (`invalid_wait`, or
    `unknown_assignee` for a user or group that does not exist).
    """
    if person is None:
        if timeout is not None or on_timeout is not None:
            raise _invalid(f"wait {key!r}: timeout and on_timeout need person=Person(...); without a person the "
                           "policy's marks are the deadline")
        return None
    if not isinstance(person, Person):
        raise _invalid(f"wait {key!r}: person must be a waits.policy.Person, not {type(person).__name__}")
    if not isinstance(person.prompt, str) or not person.prompt.strip():
        raise _invalid(f"wait {key!r}: the person's prompt must say what they stand in for")
    try:
        Draft202012Validator.check_schema(person.schema)
    except SchemaError as exc:
        raise _invalid(f"wait {key!r}: the result schema is not a valid JSON Schema: {exc.message}") from exc
    try:
        seconds = seconds_of(timeout)
    except (TypeError, ValueError) as exc:
        raise _invalid(f"wait {key!r}: {exc}") from exc
    if on_timeout is not None and seconds is None:
        raise _invalid(f"wait {key!r}: on_timeout needs a timeout")
    try:
        policy = deadline_policy_json(on_timeout, schema=person.schema) if seconds is not None else None
    except JobFailure as exc:
        if exc.code != "invalid_question":
            raise
        raise _invalid(f"wait {key!r}: {exc.message}") from exc
    if person.assignees is not None:
        try:
            names = assignee_list(person.assignees)
        except ValueError as exc:
            raise _invalid(f"wait {key!r}: {exc}") from exc
        assignees = assignees_resolve(names)
    else:
        assignees = assignees_resolve(list(settings.APPROVALS_DEFAULT_ASSIGNEES), create_groups=True)
    return {
        "person": {"prompt": person.prompt, "schema": person.schema,
                   "details": person.details if person.details is not None else {}},
        "assignees": assignees, "timeout": seconds, "on_timeout": policy,
    }


# -- who may act --------------------------------------------------------------------------------
def wait_check_can_act(*, wait: Wait, user: Any) -> None:
    """The one check of who may act for the person channel of `wait`, for every path (admin, job
    page, API): the rule of questions (see the module's docstring). Raises NotAllowedToAct
    saying which rule refused."""
    if not wait.has_person:
        raise NotAllowedToAct(f"wait {wait.key!r} has no person channel: only its service can end it")
    if user is None or not user.is_authenticated or not user.is_active:
        raise NotAllowedToAct("sign in to act on waits")
    username = user.get_username()
    if not user.has_perm(ANSWER_PERMISSION):
        raise NotAllowedToAct(f"user {username!r} may not stand in for services (needs the {ANSWER_PERMISSION!r} "
                              "permission, for example through the 'reviewers' group)")
    if not user.is_superuser:
        assigned = Wait.objects.filter(pk=wait.pk).filter(Q(assigned_users=user) | Q(assigned_groups__user=user))
        if not assigned.exists():
            who = ", ".join(wait.assignee_names()) or "nobody (only superusers may act)"
            raise NotAllowedToAct(f"this wait is assigned to {who}; {username!r} is not one of them")
    job = wait.job
    if job.owner_id is not None and job.owner_id == user.pk and job.kind not in kinds_allowing_self_approval():
        raise NotAllowedToAct(f"{username!r} submitted this job and may not stand in for its service (job kind "
                              f"{job.kind!r} does not allow self-approval); another person must act")


def result_validate(*, schema: dict, result: Any) -> None:
    """Raise InvalidResult naming the offending field when `result` breaks `schema`."""
    error = best_match(Draft202012Validator(schema).iter_errors(result))
    if error is None:
        return
    where = ".".join(str(part) for part in error.absolute_path)
    field = f"result.{where}" if where else "result"
    raise InvalidResult(f"{field}: {error.message}", field=field)


# -- what a person does -------------------------------------------------------------------------
def wait_provide(*, wait_id: Any, user: Any, result: Any, comment: str = "", via: str = "admin",
                 client_address: str | None = None) -> Wait:
    """A person provides the result (checked against the wait's schema): the wait ends with it
    and the job resumes once; `ctx.wait_for` returns it. See `_act` for what is refused."""

    def provide(wait: Wait, now: datetime) -> None:
        result_validate(schema=wait.schema, result=result)
        _update(wait, state=Wait.State.SUCCEEDED, result=result, error=None, next_due_at=None,
                ended_by=Channel.PERSON, ended_at=now)
        _event(wait, "done", {"by": "person", "user": user.get_username(), "via": via})
        wait_decision_record(wait=wait, kind=Kind.PROVIDED, channel=Channel.PERSON, actor=user, via=via,
                             result=result, comment=comment, client_address=client_address)
        job_wake(job_id=wait.job_id, on=wait_suspension(wait.key), reason={"wait": wait.key, "by": "person"})

    return _act(wait_id=wait_id, user=user, action="provide", via=via, client_address=client_address, apply=provide)


def wait_retry_submit(*, wait_id: Any, user: Any, comment: str = "", via: str = "admin",
                      client_address: str | None = None) -> Wait:
    """A person has the work handed out again (the service lost it): a new token (the old one no
    longer wakes anything), the budgets and the marks start again, the one deadline stays. The
    job resumes once and calls `submit` again."""

    def retry(wait: Wait, now: datetime) -> None:
        _update(wait, **token_fields_fresh(), state=Wait.State.SUBMITTING, external_id="", checks=0,
                throttle_bounces=0, transport_failures=0, executions=0, accepted_at=None, last_checked_at=None,
                next_due_at=now, woken_at=now, woken_by="person", result=None, error=None)
        _event(wait, "woken", {"by": "person", "user": user.get_username(), "action": "retry_submit", "via": via})
        wait_decision_record(wait=wait, kind=Kind.RETRIED, channel=Channel.PERSON, actor=user, via=via,
                             comment=comment, client_address=client_address,
                             detail={"previous_external_id": wait.external_id})
        job_wake(job_id=wait.job_id, on=wait_suspension(wait.key), reason={"wait": wait.key, "by": "person"})

    return _act(wait_id=wait_id, user=user, action="retry", via=via, client_address=client_address, apply=retry)


def wait_fail(*, wait_id: Any, user: Any, reason: str, via: str = "admin",
              client_address: str | None = None) -> Wait:
    """A person fails the wait with a reason: the job fails at once with `failed_by_person`."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidResult("reason: say why the wait fails", field="reason")

    def fail(wait: Wait, now: datetime) -> None:
        name = user.get_username()
        error = {"code": "failed_by_person", "message": f"{name}: {reason}"[:2000]}
        _update(wait, state=Wait.State.FAILED, error=error, next_due_at=None, ended_by=Channel.PERSON, ended_at=now)
        _event(wait, "failed", {"code": "failed_by_person", "by": "person", "user": name, "reason": reason[:500]})
        wait_decision_record(wait=wait, kind=Kind.FAILED, channel=Channel.PERSON, actor=user, via=via,
                             comment=reason, client_address=client_address)
        job_fail_suspended(job_id=wait.job_id, code="failed_by_person", from_=[Job.Status.WAITING],
                           message=f"{name} failed wait {wait.key!r}: {reason}")

    return _act(wait_id=wait_id, user=user, action="fail", via=via, client_address=client_address, apply=fail)


def _act(*, wait_id: Any, user: Any, action: str, via: str, client_address: str | None, apply: Any) -> Wait:
    """Lock the job's row, then the wait's; check who acts; act only while the job is parked on
    the wait. When something came first (the wait ended, or the job was woken and is looking at
    the service), the person is told what, with a `refused` row in the ledger (committed; then
    WaitEnded or WaitBusy is raised)."""
    job_id = Wait.objects.filter(pk=wait_id).values_list("job_id", flat=True).first()
    if job_id is None:
        raise WaitNotFound(f"wait {wait_id} does not exist")
    refused: WaitEnded | WaitBusy | None = None
    with transaction.atomic():
        status = Job.objects.select_for_update().filter(pk=job_id).values_list("status", flat=True).first()
        wait = Wait.objects.select_for_update(of=("self",)).select_related("job").get(pk=wait_id)
        wait_check_can_act(wait=wait, user=user)
        if not wait.is_active:
            refused = WaitEnded(f"too late: this wait already ended; {wait_ended_text(wait)}")
        elif status != Job.Status.WAITING:
            refused = WaitBusy(_busy_text(wait, status))
        if refused is not None:
            wait_decision_record(wait=wait, kind=Kind.REFUSED, channel=Channel.PERSON, actor=user, via=via,
                                 client_address=client_address, comment=refused.message,
                                 detail={"action": action, "job_status": status})
        else:
            apply(wait, database_now())
    if refused is not None:
        raise refused
    wait.refresh_from_db()
    return wait


def _busy_text(wait: Wait, status: str) -> str:
    if status == Job.Status.PENDING:
        first = {"callback": "the service called back", "admin": "a person asked for a check now",
                 "person": "a person retried the submit"}.get(wait.woken_by, "a backup check came due")
        return (f"{first} first: the job is about to look at the service's answer. "
                "Act again if it parks on this wait again.")
    if status == Job.Status.PROCESSING:
        return "the job is running and looking at the service's answer right now; act again if it parks again"
    return f"the job is {status}, not parked on this wait"


def _update(wait: Wait, **fields: Any) -> None:
    Wait.objects.filter(pk=wait.pk).update(**fields, updated_at=db_now())


def _event(wait: Wait, status: str, message: dict[str, Any]) -> None:
    event_append(job_id=wait.job_id, type="wait", step=wait.key, status=status, message=message)


# -- the one deadline ---------------------------------------------------------------------------
def waits_expire_due(*, now: datetime | None = None, limit: int = 200) -> int:
    """Apply the deadline policy of every combined wait past its deadline whose job is parked
    on it (at most `limit`, earliest first). Run by beat with the due checks; safe in several
    processes at once (a job whose row another process holds is left to the next pass). `now` (a
    test's) defaults to the database's time, the clock deadlines are written with (`jobs.clock`)."""
    now = now or database_now()
    due = list(
        Wait.objects.filter(state__in=Wait.ACTIVE, person__isnull=False, deadline_at__lte=now,
                            job__status=Job.Status.WAITING)
        .order_by("deadline_at").values_list("pk", flat=True)[:limit]
    )
    handled = 0
    for wait_id in due:
        try:
            handled += wait_expire(wait_id=wait_id, now=now) is not None
        except Exception:  # one broken wait must not stop the others
            logger.exception("applying the deadline of wait %s failed", wait_id)
    return handled


def wait_expire(*, wait_id: Any, now: datetime | None = None) -> str | None:
    """Apply the `on_timeout` policy of one combined wait if it is still active, past its
    deadline and its job parked on it; return the action taken (`default`, `fail`, `cancel`,
    `escalate`) or None (something else came first, not due, or locked by another pass)."""
    now = now or database_now()
    job_id = Wait.objects.filter(pk=wait_id).values_list("job_id", flat=True).first()
    with transaction.atomic():
        if not Job.objects.select_for_update(skip_locked=True).filter(pk=job_id, status=Job.Status.WAITING).exists():
            return None
        wait = Wait.objects.select_for_update().filter(
            pk=wait_id, state__in=Wait.ACTIVE, person__isnull=False, deadline_at__lte=now
        ).first()
        if wait is None:
            return None
        policy = wait.on_timeout or {"action": "fail"}
        action = policy.get("action", "fail")
        deadline = f"the deadline passed ({iso_utc(wait.deadline_at)})"
        if action == "escalate":
            _escalate(wait, policy, now)
        elif action == "default":
            result = policy.get("answer")
            _update(wait, state=Wait.State.SUCCEEDED, result=result, next_due_at=None, ended_by=Channel.DEADLINE,
                    ended_at=now)
            _event(wait, "done", {"by": "deadline", "on_timeout": "default"})
            wait_decision_record(wait=wait, kind=Kind.DEFAULTED, channel=Channel.DEADLINE, result=result,
                                 comment=f"{deadline}; the default result is used")
            job_wake(job_id=wait.job_id, on=wait_suspension(wait.key), reason={"wait": wait.key, "by": "deadline"})
        elif action == "cancel":
            _update(wait, state=Wait.State.CANCELLED, next_due_at=None, ended_by=Channel.DEADLINE, ended_at=now,
                    error={"code": "cancelled", "message": f"{deadline}; the job was cancelled"})
            _event(wait, "failed", {"code": "cancelled", "by": "deadline"})
            wait_decision_record(wait=wait, kind=Kind.CANCELLED, channel=Channel.DEADLINE,
                                 comment=f"{deadline}; the job was cancelled")
            job_cancel(job_id=wait.job_id, channel="system")
        else:
            message = f"nobody and nothing ended wait {wait.key!r} before its deadline"
            _update(wait, state=Wait.State.FAILED, next_due_at=None, ended_by=Channel.DEADLINE, ended_at=now,
                    error={"code": "deadline_exceeded", "message": message})
            _event(wait, "failed", {"code": "deadline_exceeded", "by": "deadline"})
            wait_decision_record(wait=wait, kind=Kind.FAILED, channel=Channel.DEADLINE,
                                 comment=f"{deadline}; the job failed")
            try:
                job_fail_suspended(job_id=wait.job_id, code="deadline_exceeded", message=message,
                                   from_=[Job.Status.WAITING])
            except InvalidTransition as exc:  # cannot happen under the job's lock; keep the wait closed anyway
                logger.warning("wait %s expired but its job could not be failed: %s", wait.pk, exc)
        return action


def _escalate(wait: Wait, policy: dict[str, Any], now: datetime) -> None:
    """Reassign the person channel with the escalation's own deadline and policy."""
    timeout = policy.get("timeout")
    deadline_at = now + timedelta(seconds=timeout) if timeout else None
    _update(wait, deadline_at=deadline_at, on_timeout=policy.get("then") if timeout else None)
    wait.assigned_users.set(policy.get("users") or [])
    wait.assigned_groups.set(policy.get("groups") or [])
    detail = {"to": policy.get("to"), "deadline_at": iso_utc(deadline_at)}
    _event(wait, "escalated", detail)
    wait_decision_record(wait=wait, kind=Kind.ESCALATED, channel=Channel.DEADLINE, detail=detail,
                         comment=f"the deadline passed; reassigned to {', '.join(policy.get('to') or [])}")
