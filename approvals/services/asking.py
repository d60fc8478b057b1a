"""Asking: what `ctx.ask` checks before a job pauses, opening (and re-opening) a question, and
cancelling the open questions of a cancelled job."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils.dateparse import parse_datetime
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from approvals.models import ASKED_AGAIN_REASONS, Decision, Question
from approvals.policies import Default, Escalate, assignee_list, policy_from, policy_to_json, seconds_of
from approvals.schemas import QuestionType, question_type
from approvals.services.ledger import decision_record
from jobs.clock import database_now
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


def deadline_policy_json(policy: Any, *, schema: dict) -> dict[str, Any]:
    """An `on_timeout` policy (`approvals.policies`) checked and turned into the JSON stored with
    what it applies to, an escalation's assignees resolved: for questions, and for the one
    deadline of a combined wait (`waits`). A `Default` answer must fit `schema`. Raises
    JobFailure `invalid_question` (or `unknown_assignee`)."""
    return _policy_json(policy, schema=schema)


def question_policy_digest(
    *, assignees: list[str], required_approvals: int, timeout: float | None, on_timeout: dict[str, Any] | None
) -> str:
    """The digest of the rule an answer is given under: who is asked (as the author wrote them:
    names and `group:name`s, so a change of a group's members is not a change of policy), the
    quorum, the deadline and its policy. An answer given under another digest is not used: the
    question is asked again (`policy_changed`)."""
    canonical = json.dumps({"assignees": sorted(assignees), "required_approvals": required_approvals,
                            "timeout": timeout, "on_timeout": on_timeout}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
    valid_for: float | timedelta | None = None,
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
        valid_seconds = seconds_of(valid_for)
    except (TypeError, ValueError) as exc:
        raise _invalid(f"question {key!r}: {exc}") from exc
    if on_timeout is not None and seconds is None:
        raise _invalid(f"question {key!r}: on_timeout needs a timeout")
    on_timeout_json = _policy_json(on_timeout, schema=schema) if seconds is not None else None
    spec: dict[str, Any] = {
        "key": key, "prompt": prompt, "schema": schema, "details": details, "digest": digest,
        "required_approvals": required_approvals, "timeout": seconds, "on_timeout": on_timeout_json,
        "valid_for": valid_seconds,
    }
    names = list(settings.APPROVALS_DEFAULT_ASSIGNEES)
    if assignees is not None:
        try:
            names = assignee_list(assignees)
        except ValueError as exc:
            raise _invalid(f"question {key!r}: {exc}") from exc
        spec["assignees"] = assignees_resolve(names)
    spec["policy_digest"] = question_policy_digest(
        assignees=names, required_approvals=required_approvals, timeout=seconds,
        on_timeout=policy_to_json(policy_from(on_timeout)) if seconds is not None else None,
    )
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
    policy_digest: str = "",
    valid_for: float | None = None,
) -> Question:
    """Open question `key` of `job` unless it exists (a re-run asks it again): assign it (by
    default to APPROVALS_DEFAULT_ASSIGNEES), start its deadline, and tell the assignees.

    A question that was cancelled or expired is asked again (a person retried its job): it
    opens for a new round, with a `reopened` row in the ledger; earlier rows stay.
    Precondition: the caller is in the transaction that pauses the job. Its times (the deadline)
    are the database's (`jobs.clock`): beat, on another host, compares them with that clock.
    """
    now = database_now()
    expires_at = now + timedelta(seconds=timeout) if timeout else None
    question = Question.objects.select_for_update().filter(job=job, key=key).first()
    closed = (Question.Status.CANCELLED, Question.Status.EXPIRED)
    if question is None:
        question = Question.objects.create(
            job=job, key=key, prompt=prompt, schema=schema, details=details, digest=digest,
            required_approvals=required_approvals, expires_at=expires_at, on_timeout=on_timeout, opened_at=now,
            policy_digest=policy_digest, valid_for=valid_for,
        )
        action = "open"
    elif question.status in closed and question.digest == digest:
        because = f"previous_round_{question.status}"
        _new_round(question, because=because, required_approvals=required_approvals, expires_at=expires_at,
                   on_timeout=on_timeout, policy_digest=policy_digest, valid_for=valid_for, now=now)
        decision_record(question=question, kind=Decision.Kind.REOPENED, channel=Decision.Channel.SYSTEM,
                        comment=ASKED_AGAIN_REASONS[because],
                        detail={"round": question.round, "because": because})
        action = "reopened"
    else:
        return question
    _announce_round(question=question, job=job, assignees=assignees, action=action)
    return question


def _new_round(question: Question, *, because: str, required_approvals: int, expires_at: Any,
               on_timeout: dict[str, Any] | None, policy_digest: str, valid_for: float | None, now: Any) -> None:
    """Open the next round of `question` under the policy given. Caller holds its row lock."""
    question.status = Question.Status.OPEN
    question.round += 1
    question.answer, question.comment, question.answered_by, question.answered_at = None, "", None, None
    question.required_approvals = required_approvals
    question.expires_at, question.on_timeout = expires_at, on_timeout
    question.policy_digest, question.valid_for = policy_digest, valid_for
    question.asked_again_because = because
    question.opened_at = now
    question.save(update_fields=[
        "status", "round", "answer", "comment", "answered_by", "answered_at", "required_approvals",
        "expires_at", "on_timeout", "policy_digest", "valid_for", "asked_again_because", "opened_at",
    ])


def _announce_round(*, question: Question, job: Job, assignees: dict[str, list[int]] | None, action: str) -> None:
    """Assign the round, write its `question open` event and tell the assignees."""
    from approvals.services.notifications import question_announce

    question_assign(question=question, assignees=assignees or default_assignees())
    message = {"question": str(question.pk), "assignees": question.assignee_names(), "round": question.round,
               "expires_at": iso_utc(question.expires_at)}
    if question.asked_again_because:
        message["asked_again_because"] = question.asked_again_because
    event_append(job_id=job.pk, type="question", step=question.key, status="open", message=message)
    question_announce(question=question, job=job, action=action)


def question_ask_again(
    *,
    job: Job,
    key: str,
    spec: dict[str, Any],
) -> bool:
    """Ask an answered question again, as a new round, because its answer failed the checks at
    use (`approvals.services.rechecking.answer_recheck`): a reviewer who approved is no longer
    allowed, the policy changed in code, or the answer is older than `valid_for`.

    Approving votes that are still valid carry over to the new round (as `approved` rows of the
    system, naming the reviewer and when they voted), at most one short of the new quorum, so
    that the round is always decided by a person acting now. The `reopened` row says why; the
    assignees are told again. Returns True when, under the lock, the answer holds after all
    (nothing to ask: the job is runnable at once).

    Precondition: the caller is in the transaction that pauses the job, holding the job's row
    lock (`jobs.services.job_suspend`).
    """
    from approvals.services.rechecking import answer_recheck

    question = Question.objects.select_for_update().select_related("job").filter(job=job, key=key).first()
    if question is None or question.status != Question.Status.ANSWERED:
        question_open(job=job, **{name: value for name, value in spec.items() if name in _OPEN_FIELDS})
        return False
    assignees = spec.get("assignees") or default_assignees()
    verdict = answer_recheck(question=question, policy_digest=spec["policy_digest"], assignees=assignees,
                             valid_for=spec.get("valid_for"))
    if verdict.holds:
        return True
    previous = question.round
    now = database_now()
    expires_at = now + timedelta(seconds=spec["timeout"]) if spec.get("timeout") else None
    required = spec.get("required_approvals", 1)
    carried = verdict.carried[-(required - 1):] if required > 1 else []  # the freshest votes
    for vote in verdict.carried[:len(verdict.carried) - len(carried)]:
        verdict.dropped.append({"reviewer": vote.actor_name,
                                "why": "not carried over: the new round needs at least one approval given now"})
    _new_round(question, because=verdict.because, required_approvals=required, expires_at=expires_at,
               on_timeout=spec.get("on_timeout"), policy_digest=spec["policy_digest"],
               valid_for=spec.get("valid_for"), now=now)
    decision_record(
        question=question, kind=Decision.Kind.REOPENED, channel=Decision.Channel.SYSTEM, comment=verdict.text,
        detail={"round": question.round, "because": verdict.because, "reasons": verdict.reasons,
                "dropped": verdict.dropped, "carried": [vote.actor_name for vote in carried],
                "previous_round": previous},
    )
    for number, vote in enumerate(carried, 1):
        decision_record(
            question=question, kind=Decision.Kind.APPROVED, actor=vote.actor, channel=Decision.Channel.SYSTEM,
            answer=vote.answer, comment=f"carried over from round {previous}",
            detail={"approvals": number, "required": required, "carried_over_from_round": previous,
                    "decision": vote.pk, "voted_at": iso_utc(vote_time(vote))},
        )
    _announce_round(question=question, job=job, assignees=spec.get("assignees"), action="reopened")
    return False


def vote_time(vote: Decision) -> Any:
    """When the reviewer really voted: a vote carried over to a later round keeps its time."""
    voted_at = (vote.detail or {}).get("voted_at")
    return parse_datetime(voted_at) if voted_at else vote.created_at


_OPEN_FIELDS = ("key", "prompt", "schema", "details", "digest", "assignees", "required_approvals", "timeout",
                "on_timeout", "policy_digest", "valid_for")


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
