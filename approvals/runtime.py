"""`ctx.ask` and `ctx.question`: what job code calls to ask a person, registered on the job
context by `approvals.extensions` (the core knows nothing of questions).

    answer = ctx.ask("approve", "Publish this?", schema=approval(), details={"draft": draft})
    decision = ctx.ask("approve", "Publish this?", answer=Approval, details=draft)   # typed: an Approval
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from approvals.models import Question
from approvals.schemas import APPROVAL_SCHEMA, answer_schema
from approvals.services import question_ask_again, question_open, question_spec_build
from approvals.services.asking import default_assignees
from approvals.services.rechecking import answer_recheck
from jobs import typed
from jobs.runtime import JobFailure, PauseForResolution

if TYPE_CHECKING:
    from jobs.models import Job
    from jobs.runtime import JobContext


def question_digest(*, prompt: str, schema: dict, details: Any) -> str:
    """The digest of what a reviewer is shown: a re-run must ask exactly the same question."""
    canonical = json.dumps({"prompt": prompt, "schema": schema, "details": details}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _pause(spec: dict[str, Any]) -> PauseForResolution:
    def apply(job: Job) -> None:  # in the transaction that pauses the job (jobs.services.job_suspend)
        question_open(job=job, **spec)

    return PauseForResolution(spec, apply=apply)


def _ask_again(spec: dict[str, Any], because: str) -> PauseForResolution:
    def apply(job: Job) -> bool:  # in the transaction that pauses the job, the job's row locked first
        return question_ask_again(job=job, key=spec["key"], spec=spec)

    return PauseForResolution({**spec, "asked_again_because": because}, apply=apply)


def ask(
    ctx: JobContext,
    key: str,
    prompt: str,
    *,
    schema: dict | None = None,
    answer: Any = None,
    details: Any = None,
    assignees: str | list[str] | None = None,
    required_approvals: int = 1,
    timeout: float | timedelta | None = None,
    on_timeout: Any = None,
    valid_for: float | timedelta | None = None,
) -> Any:
    """Ask a person; return their answer once there is one.

    The first time, this raises `PauseForResolution`: the job is `paused` with the question
    open, and the worker moves on. When the answer (validated against `schema`) arrives,
    the job runs again from the top and this call returns the answer. `key` names the
    question within the job and must be stable across runs. If a re-run asks the same key
    with another prompt, schema or details, the job fails with `question_changed` rather
    than reuse an answer given to something else.

    `schema` is a JSON Schema, usually from `approvals.schemas` (`approval()`, `choice(...)`,
    `multiple_choice(...)`, `text(...)`, `form(...)`); default: approve/reject with an
    optional reason. `assignees` are usernames and `"group:name"`s (default: the group
    `reviewers`); `required_approvals` distinct reviewers must approve an approval question
    (any rejection decides at once). After `timeout` (seconds or a timedelta) beat applies
    `on_timeout` (`approvals.policies`: `Default(answer)`, `Fail()` (the default),
    `Cancel()`, `Escalate(to=..., timeout=...)`). A mistake in these fails the job with
    `invalid_question` or `unknown_assignee`. A question that was cancelled or expired is
    asked again when a person retries the job.

    A stored answer is checked again each time this call is about to return it
    (`approvals.services.rechecking`): every reviewer whose approval counts must still be
    active and allowed to answer, the policy (`assignees`, `required_approvals`, `timeout`,
    `on_timeout`) must be the one the answer was given under, and the answer must be younger
    than `valid_for` (seconds or a timedelta; default: no limit). When a check fails the
    answer is not used: the question is asked again as a new round (still-valid votes carry
    over), the job pauses again, and the ledger says why (`reviewer_no_longer_allowed`,
    `policy_changed`, `approval_stale`).

    `answer` (a pydantic model, an `Enum`, a `Literal`, …) types the answer: the schema, and so
    the admin's and the job page's form, is derived from it (unless `schema` is given too, e.g.
    a `choice(...)` with labels), and the answer comes back as an instance of it. `details`
    may be a model too.
    """
    if schema is None:
        schema = answer_schema(answer) if answer is not None else APPROVAL_SCHEMA
    details = typed.to_json(details) if details is not None else {}
    digest = question_digest(prompt=prompt, schema=schema, details=details)
    question = Question.objects.select_related("job").filter(job_id=ctx.job_id, key=key).first()
    if question is not None and question.digest != digest:
        raise JobFailure(
            "question_changed",
            f"question {key!r} was asked again with a different prompt, schema or details; "
            "the stored answer was given to the old question and is not reused",
        )
    if question is not None and question.status == Question.Status.OPEN:
        raise _pause({"key": key, "prompt": prompt, "schema": schema, "details": details, "digest": digest})
    # Check what the author passed: to open the question, or to judge a stored answer by it.
    spec = question_spec_build(
        key=key, prompt=prompt, schema=schema, details=details, digest=digest, assignees=assignees,
        required_approvals=required_approvals, timeout=timeout, on_timeout=on_timeout, valid_for=valid_for,
    )
    if question is not None and question.status == Question.Status.ANSWERED:
        verdict = answer_recheck(
            question=question, policy_digest=spec["policy_digest"],
            assignees=spec.get("assignees") or default_assignees(), valid_for=spec["valid_for"],
        )
        if verdict.holds:
            return _answer_as(answer, key, question.answer)
        raise _ask_again(spec, verdict.because)
    # New, or cancelled/expired and asked again after a retry.
    raise _pause(spec)


def _answer_as(answer_type: Any, key: str, value: Any) -> Any:
    if answer_type is None:
        return value
    try:
        return typed.from_json(answer_type, value)
    except typed.ValidationError as exc:
        field, message = typed.error_field(exc, "answer")
        raise JobFailure("invalid_answer", f"the answer to question {key!r} does not fit "
                         f"{getattr(answer_type, '__name__', answer_type)}: {field}: {message}") from None


def question(ctx: JobContext, key: str) -> Question | None:
    """The stored question `key` of this job (who answered it and when), or None."""
    return Question.objects.select_related("answered_by").filter(job_id=ctx.job_id, key=key).first()
