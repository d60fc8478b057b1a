"""Asking: what `ctx.ask` checks before a job pauses, opening (and re-opening) a question, and
cancelling the open questions of a cancelled job."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from approvals.models import Decision, Question
from approvals.policies import Default, Escalate, assignee_list, policy_from, policy_to_json, seconds_of
from approvals.schemas import QuestionType, question_type
from approvals.services.ledger import decision_record
from jobs.events import event_append
from jobs.models import Job
from jobs.runtime import JobFailure
from jobs.timestamps import iso_utc

logger = logging.getLogger(__name__)

GROUP_PREFIX = "group:"


def _invalid(message: str) -> JobFailure:
    return JobFailure("invalid_question", message)


def assignees_resolve(names: list[str], *, create_groups: bool = False) -> dict[str, list[int]]:
    """`["alice", "group:ops"]` as `{"users": [ids], "groups": [ids]}`.

    Raises JobFailure `unknown_assignee` naming what does not exist (with `create_groups`, a
    missing group is made instead: the default assignees must not fail a job).
    """
    usernames = [name for name in names if not name.startswith(GROUP_PREFIX)]
    group_names = [name[len(GROUP_PREFIX):] for name in names if name.startswith(GROUP_PREFIX)]
    users = dict(get_user_model().objects.filter(username__in=usernames).values_list("username", "pk"))
    groups = dict(Group.objects.filter(name__in=group_names).values_list("name", "pk"))
    for name in group_names:
        if name not in groups and create_groups:
            groups[name] = Group.objects.get_or_create(name=name)[0].pk
    missing = [u for u in usernames if u not in users] + [GROUP_PREFIX + g for g in group_names if g not in groups]
    if missing:
        raise JobFailure("unknown_assignee", f"no such user or group to ask: {', '.join(missing)}")
    return {"users": sorted(users.values()), "groups": sorted(groups.values())}


def default_assignees() -> dict[str, list[int]]:
    """APPROVALS_DEFAULT_ASSIGNEES (the group `reviewers`), resolved; a missing group is made."""
    return assignees_resolve(list(settings.APPROVALS_DEFAULT_ASSIGNEES), create_groups=True)


def _policy_json(policy: Any, *, schema: dict, depth: int = 0) -> dict[str, Any]:
    """Validate an on_timeout policy (and an escalation's own) and return its stored JSON."""
    if depth > 5:
        raise _invalid("escalations nest too deeply (at most 5)")
    try:
        policy = policy_from(policy)
        data = policy_to_json(policy)
    except ValueError as exc:
        raise _invalid(str(exc)) from exc
    if isinstance(policy, Default):
        errors = sorted(Draft202012Validator(schema).iter_errors(policy.answer), key=str)
        if errors:
            raise _invalid(f"the default answer {policy.answer!r} breaks the answer schema: {errors[0].message}")
    if isinstance(policy, Escalate):
        data.update(assignees_resolve(data["to"]))
        data["then"] = _policy_json(policy.on_timeout, schema=schema, depth=depth + 1)
    return data


def question_spec_build(
    *,
    key: str,
    prompt: str,
    schema: dict,
    details: Any,
    digest: str,
    assignees: str | list[str] | None = None,
    required_approvals: int = 1,
    timeout: float | timedelta | None = None,
    on_timeout: Any = None,
) -> dict[str, Any]:
    """Check what a job author passed to `ctx.ask` and return the question as `job_pause` opens it.

    A mistake is the author's bug and fails the job at once (JobFailure `invalid_question`, or
    `unknown_assignee` for a user or group that does not exist), rather than pausing on a
    question nobody can answer.
    """
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise _invalid(f"question {key!r}: its schema is not a valid JSON Schema: {exc.message}") from exc
    if not isinstance(required_approvals, int) or isinstance(required_approvals, bool) or required_approvals < 1:
        raise _invalid(f"question {key!r}: required_approvals must be a whole number from 1, "
                       f"not {required_approvals!r}")
    if required_approvals > 1 and question_type(schema) != QuestionType.APPROVAL:
        raise _invalid(f"question {key!r}: a quorum (required_approvals > 1) needs an approve/reject schema")
    try:
        seconds = seconds_of(timeout)
    except (TypeError, ValueError) as exc:
        raise _invalid(f"question {key!r}: {exc}") from exc
    if on_timeout is not None and seconds is None:
        raise _invalid(f"question {key!r}: on_timeout needs a timeout")
    spec: dict[str, Any] = {
        "key": key, "prompt": prompt, "schema": schema, "details": details, "digest": digest,
        "required_approvals": required_approvals, "timeout": seconds,
        "on_timeout": _policy_json(on_timeout, schema=schema) if seconds is not None else None,
    }
    if assignees is not None:
        try:
            names = assignee_list(assignees)
        except ValueError as exc:
            raise _invalid(f"question {key!r}: {exc}") from exc
        spec["assignees"] = assignees_resolve(names)
    return spec


def question_assign(*, question: Question, assignees: dict[str, list[int]]) -> None:
    """Replace who may answer `question`. Caller holds the question's row lock."""
    question.assigned_users.set(assignees.get("users") or [])
    question.assigned_groups.set(assignees.get("groups") or [])


def question_open(
    *,
    job: Job,
    key: str,
    prompt: str,
    schema: dict,
    details: Any,
    digest: str,
    assignees: dict[str, list[int]] | None = None,
    required_approvals: int = 1,
    timeout: float | None = None,
    on_timeout: dict[str, Any] | None = None,
) -> Question:
    """Open question `key` of `job` unless it exists (a re-run asks it again): assign it (by
    default to APPROVALS_DEFAULT_ASSIGNEES), start its deadline, and tell the assignees.

    A question that was cancelled or expired is asked again (a person retried its job): it
    opens for a new round, with a `reopened` row in the ledger; earlier rows stay.
    Precondition: the caller is in the transaction that pauses the job.
    """
    from approvals.services.notifications import question_announce

    now = timezone.now()
    expires_at = now + timedelta(seconds=timeout) if timeout else None
    question = Question.objects.select_for_update().filter(job=job, key=key).first()
    closed = (Question.Status.CANCELLED, Question.Status.EXPIRED)
    if question is None:
        question = Question.objects.create(
            job=job, key=key, prompt=prompt, schema=schema, details=details, digest=digest,
            required_approvals=required_approvals, expires_at=expires_at, on_timeout=on_timeout, opened_at=now,
        )
        action = "open"
    elif question.status in closed and question.digest == digest:
        question.status = Question.Status.OPEN
        question.round += 1
        question.answer, question.comment, question.answered_by, question.answered_at = None, "", None, None
        question.required_approvals = required_approvals
        question.expires_at, question.on_timeout = expires_at, on_timeout
        question.opened_at = now
        question.save(update_fields=[
            "status", "round", "answer", "comment", "answered_by", "answered_at", "required_approvals",
            "expires_at", "on_timeout", "opened_at",
        ])
        decision_record(question=question, kind=Decision.Kind.REOPENED, channel=Decision.Channel.SYSTEM,
                        detail={"round": question.round})
        action = "reopened"
    else:
        return question
    question_assign(question=question, assignees=assignees or default_assignees())
    event_append(
        job_id=job.pk, type="question", step=key, status="open",
        message={"question": str(question.pk), "assignees": question.assignee_names(), "round": question.round,
                 "expires_at": iso_utc(expires_at)},
    )
    question_announce(question=question, job=job, action=action)
    return question


def questions_cancel_for_job(*, job: Job, actor: Any = None, channel: str | None = None,
                             comment: str = "the job was cancelled") -> int:
    """Cancel the open questions of `job` (it was cancelled, or ended otherwise: `comment` says
    how), each with a ledger row. Caller holds the transaction."""
    count = 0
    channel = channel or (Decision.Channel.SYSTEM if actor is None else Decision.Channel.ADMIN)
    for question in Question.objects.select_for_update().filter(job=job, status=Question.Status.OPEN):
        question.status = Question.Status.CANCELLED
        question.save(update_fields=["status"])
        decision_record(question=question, kind=Decision.Kind.CANCELLED, actor=actor, channel=channel,
                        comment=comment)
        event_append(
            job_id=job.pk,
            type="question",
            step=question.key,
            status="cancelled",
            message={"by": getattr(actor, "username", None)},
        )
        count += 1
    return count
