"""Every write to a question goes through here; the admin and the API call the same functions."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from approvals.models import Question
from approvals.selectors import ANSWER_PERMISSION
from jobs.errors import PlatformError
from jobs.events import event_append
from jobs.models import Job
from jobs.services import job_resume


class QuestionNotFound(PlatformError):
    code = "not_found"
    http_status = 404


class InvalidAnswer(PlatformError):
    code = "invalid_answer"


class AlreadyAnswered(PlatformError):
    code = "already_answered"
    http_status = 409


class QuestionClosed(PlatformError):
    code = "question_closed"
    http_status = 409


class NotAllowedToAnswer(PlatformError):
    code = "not_allowed"
    http_status = 403


def question_open(*, job: Job, key: str, prompt: str, schema: dict, details: Any, digest: str) -> Question:
    """Open question `key` of `job` unless it already exists (a re-run asks it again).

    Precondition: the caller is in the transaction that pauses the job.
    """
    question, created = Question.objects.get_or_create(
        job=job, key=key, defaults={"prompt": prompt, "schema": schema, "details": details, "digest": digest}
    )
    if created:
        event_append(job_id=job.pk, type="question", step=key, status="open", message={"question": str(question.pk)})
    return question


def answer_validate(*, schema: dict, answer: Any) -> None:
    """Raise InvalidAnswer naming the offending field when `answer` breaks `schema`."""
    error = best_match(Draft202012Validator(schema).iter_errors(answer))
    if error is None:
        return
    where = ".".join(str(part) for part in error.absolute_path)
    field = f"answer.{where}" if where else "answer"
    raise InvalidAnswer(f"{field}: {error.message}", field=field)


def question_check_can_answer(*, question: Question, user: Any) -> None:
    """The one check of who may answer, for every path (admin, API). Raises NotAllowedToAnswer."""
    if user is None or not user.is_authenticated or not user.is_active:
        raise NotAllowedToAnswer("sign in to answer questions")
    if not user.has_perm(ANSWER_PERMISSION):
        raise NotAllowedToAnswer(
            f"user {user.get_username()!r} may not answer questions (needs the {ANSWER_PERMISSION!r} permission, "
            "for example through the 'reviewers' group)"
        )


def question_answer(
    *, question_id: Any, user: Any, answer: Any, comment: str = "", channel: str = "admin"
) -> Question:
    """Record `user`'s answer to an open question and resume its job.

    Validates the answer against the question's schema and the user's right to answer; records
    who and when; moves the job `paused → pending` and dispatches it after the commit. A second
    answer is refused with AlreadyAnswered naming who answered first.
    """
    with transaction.atomic():
        question = (
            Question.objects.select_for_update(of=("self",)).select_related("answered_by").filter(pk=question_id).first()
        )
        if question is None:
            raise QuestionNotFound(f"question {question_id} does not exist")
        if question.status == Question.Status.ANSWERED:
            who = question.answered_by.get_username() if question.answered_by else "someone"
            raise AlreadyAnswered(
                f"this question was already answered by {who} at {question.answered_at:%Y-%m-%d %H:%M:%S} UTC"
            )
        if question.status != Question.Status.OPEN:
            raise QuestionClosed(f"this question is {question.status} and can no longer be answered")
        question_check_can_answer(question=question, user=user)
        answer_validate(schema=question.schema, answer=answer)

        question.status = Question.Status.ANSWERED
        question.answer = answer
        question.comment = comment or ""
        question.answered_by = user
        question.answered_at = timezone.now()
        question.save(update_fields=["status", "answer", "comment", "answered_by", "answered_at"])
        event_append(
            job_id=question.job_id,
            type="question",
            step=question.key,
            status="answered",
            message={"by": user.get_username(), "channel": channel, "answer": answer},
        )
        job_resume(job_id=question.job_id, reason={"answered": question.key})
    return question


def questions_cancel_for_job(*, job: Job, actor: Any = None) -> int:
    """Cancel the open questions of `job` (it was cancelled). Caller holds the transaction."""
    count = 0
    for question in Question.objects.select_for_update().filter(job=job, status=Question.Status.OPEN):
        question.status = Question.Status.CANCELLED
        question.save(update_fields=["status"])
        event_append(
            job_id=job.pk,
            type="question",
            step=question.key,
            status="cancelled",
            message={"by": getattr(actor, "username", None)},
        )
        count += 1
    return count
