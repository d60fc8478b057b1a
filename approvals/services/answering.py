"""Answering: the one permission check and the one answer service, for every path (admin form,
admin bulk action, API, the job page) and, for deadlines, the system."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, QuerySet
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from approvals.errors import (
    AlreadyAnswered,
    AlreadyVoted,
    InvalidAnswer,
    NotAllowedToAnswer,
    QuestionClosed,
    QuestionExpired,
    QuestionNotFound,
)
from approvals.models import Decision, Question
from approvals.policies import policy_describe
from approvals.schemas import QuestionType
from approvals.selectors import ANSWER_PERMISSION, assigned_to, kinds_allowing_self_approval, with_approvals
from approvals.services.ledger import decision_record
from dbkit.instances import JSONDecodedWhenRead
from dbkit.kept import KeptRead
from jobs.clock import db_now
from jobs.conflicts import retry_on_conflict
from jobs.events import event_append
from jobs.models import Job
from jobs.services import job_lock, job_resume
from jobs.timestamps import iso_utc


def answer_validate(*, schema: dict, answer: Any) -> None:
    """Raise InvalidAnswer naming the offending field when `answer` breaks `schema`."""
    error = best_match(Draft202012Validator(schema).iter_errors(answer))
    if error is None:
        return
    where = ".".join(str(part) for part in error.absolute_path)
    field = f"answer.{where}" if where else "answer"
    raise InvalidAnswer(f"{field}: {error.message}", field=field)


def question_check_can_answer(*, question: Question, user: Any, assigned: bool | None = None) -> None:
    """The one check of who may answer, for every path (admin, bulk action, API, job page).

    The user must be signed in and active, hold the `approvals.answer_question` permission, be
    one of the question's assignees (directly or through a group; superusers may answer any
    question), and not be the job's submitter unless its kind has `allow_self_approval`.
    Raises NotAllowedToAnswer saying which rule refused.

    `assigned`: whether the question is assigned to `user`, when the caller read it with the
    question (`selectors.assigned_to`); otherwise it is one query here.
    """
    if user is None or not user.is_authenticated or not user.is_active:
        raise NotAllowedToAnswer("sign in to answer questions")
    username = user.get_username()
    if not user.has_perm(ANSWER_PERMISSION):
        raise NotAllowedToAnswer(
            f"user {username!r} may not answer questions (needs the {ANSWER_PERMISSION!r} permission, "
            "for example through the 'reviewers' group)"
        )
    if not user.is_superuser:
        if assigned is None:
            assigned = Question.objects.filter(pk=question.pk).filter(assigned_to(user)).exists()
        if not assigned:
            who = ", ".join(question.assignee_names()) or "nobody (only superusers may answer it)"
            raise NotAllowedToAnswer(f"this question is assigned to {who}; {username!r} is not one of them")
    job = question.job
    if job.owner_id is not None and job.owner_id == user.pk and job.kind not in kinds_allowing_self_approval():
        raise NotAllowedToAnswer(
            f"{username!r} submitted this job and may not answer its questions (job kind {job.kind!r} does not "
            "allow self-approval); another reviewer must answer"
        )


def _answered_by_text(question: Question) -> str:
    who = question.answered_by.get_username() if question.answered_by else "the system (its deadline passed)"
    return f"this question was already answered by {who} at {question.answered_at:%Y-%m-%d %H:%M:%S} UTC"


@retry_on_conflict
def question_answer(
    *,
    question_id: Any,
    user: Any,
    answer: Any,
    comment: str = "",
    channel: str = "admin",
    client_address: str | None = None,
    job_id: Any = None,
) -> Question:
    """Record `user`'s answer to an open question and, once it is decided, resume its job.

    Checks the question is open, the user may answer it (`question_check_can_answer`) and the
    answer fits the schema; every answer is a row in the decision ledger. For a quorum
    (`required_approvals` > 1) an approval is a vote: the question stays open until that many
    distinct reviewers approved; a rejection decides at once. A deciding answer records who and
    when and moves the job `paused → pending` (dispatched after the commit). An answer to a
    decided question raises AlreadyAnswered naming who answered first; to a cancelled or
    expired one, QuestionClosed; after the question's `expires_at` (before beat's pass expired
    it), QuestionExpired, with a `refused` row in the ledger.

    `job_id`: the question's job, when the caller has read the question already (a question's
    job never changes): one round trip less on the way to the job's resume.
    """
    too_late: QuestionExpired | None = None
    with transaction.atomic():
        # The job's row first, then the question: the platform's one lock order (a cancel locks
        # the job, then its questions), so an answer and a cancel at once never deadlock.
        if job_id is None:
            job_id = Question.objects.filter(pk=question_id).values_list("job_id", flat=True).first()
        if job_id is None:
            raise QuestionNotFound(f"question {question_id} does not exist")
        job_lock(job_id=job_id)
        checks_assignment = user is not None and user.is_authenticated and not user.is_superuser
        if checks_assignment:
            found = _LOCKED_WITH_ASSIGNMENT.rows(question_id, user.pk, using=Question.objects.db)
        else:
            found = _LOCKED.rows(question_id, getattr(user, "pk", None) or 0, using=Question.objects.db)
        question = found[0] if found else None
        if question is None:
            raise QuestionNotFound(f"question {question_id} does not exist")
        if question.status == Question.Status.ANSWERED:
            raise AlreadyAnswered(_answered_by_text(question))
        if question.status != Question.Status.OPEN:
            raise QuestionClosed(f"this question is {question.status} and can no longer be answered")
        question_check_can_answer(question=question, user=user,
                                  assigned=question.answerer_assigned if checks_assignment else None)
        answer_validate(schema=question.schema, answer=answer)
        record = {"question": question, "actor": user, "channel": channel, "answer": answer, "comment": comment,
                  "client_address": client_address}
        too_late = _refuse_if_past_deadline(question, record)
        if too_late is None:
            _decide(question, user=user, answer=answer, comment=comment, channel=channel, record=record)
    if too_late is not None:  # raised after the commit: the ledger keeps the refusal
        raise too_late
    return question


_JOB_JSON = tuple(f"job__{field.name}" for field in Job._meta.concrete_fields if isinstance(field, JSONDecodedWhenRead))


def _locked(question_id: Any, user_id: Any) -> QuerySet[Question]:
    # Not select_related("answered_by"): when this waits for another answer's lock, PostgreSQL
    # re-reads the locked row but not the joined user, which would still be "nobody".
    # With the round's approvals so far and whether one of them is `user_id`'s, for a quorum's
    # vote: read after the job's lock, which every answer takes first and holds until its commit,
    # so no earlier vote is missed (the statement's snapshot is taken once that lock is held).
    # The job for who submitted it and its kind (`question_check_can_answer`), without its JSON
    # (the input, the result, ...): a job's input may be a whole document, which an answer reads
    # nowhere; a deferred field is read from the database if anything ever reads it.
    theirs = Decision.objects.filter(question_id=OuterRef("pk"), round=OuterRef("round"),
                                     kind=Decision.Kind.APPROVED, actor_id=user_id)
    locked = (Question.objects.select_for_update(of=("self",)).select_related("job").defer(*_JOB_JSON)
              .filter(pk=question_id))
    return with_approvals(locked.order_by()).annotate(answerer_approved=Exists(theirs))


def _locked_with_assignment(question_id: Any, user_id: Any) -> QuerySet[Question]:
    # Whether it is assigned to the user is read with it, under the lock: one query.
    return _locked(question_id, user_id).annotate(answerer_assigned=ExpressionWrapper(
        assigned_to(get_user_model()(pk=user_id)), output_field=BooleanField()))


# The answer's read of its question under the lock, built once per connection (dbkit.kept): its
# ORM building was a quarter of the answer's own CPU. The stand-ins are no question's and no user's
# (a user's id appears in more than one place: each gets the read's own value).
_LOCKED = KeptRead(_locked, stand_ins=(uuid.UUID(int=0), -1))
_LOCKED_WITH_ASSIGNMENT = KeptRead(_locked_with_assignment, stand_ins=(uuid.UUID(int=0), -1))


def _refuse_if_past_deadline(question: Question, record: dict[str, Any]) -> QuestionExpired | None:
    """An answer after `expires_at` is refused even before beat's deadline pass applies the
    policy; the refusal is a ledger row. Compared with the database's clock, so that the web
    server's own clock does not decide. Caller holds the question's row lock."""
    if question.expires_at is None:
        return None
    if not Question.objects.filter(pk=question.pk, expires_at__lte=db_now()).exists():
        return None
    deadline = f"{question.expires_at:%Y-%m-%d %H:%M:%S} UTC"
    decision_record(kind=Decision.Kind.REFUSED, detail={"expires_at": iso_utc(question.expires_at)},
                    **{**record, "comment": f"came after the deadline ({deadline}); not counted"})
    return QuestionExpired(
        f"this question's deadline passed at {deadline}; the answer was not recorded as a decision "
        f"(its deadline policy, {policy_describe(question.on_timeout)}, applies within moments)"
    )


def _decide(question: Question, *, user: Any, answer: Any, comment: str, channel: str,
            record: dict[str, Any]) -> None:
    """Record the answer or the vote and, once the question is decided, settle it. Caller holds
    the question's row lock."""
    if question.type != QuestionType.APPROVAL:
        question.approvals_in_round = 0  # only approval questions take votes (for the response)
        decision = {"kind": Decision.Kind.ANSWERED, **record}
    elif not answer.get("approved"):
        decision = {"kind": Decision.Kind.REJECTED, **record}
    else:
        # The round's approvals so far and whether this user's is among them, read with the
        # question under the lock (`_locked`).
        so_far = question.approvals_in_round
        if question.answerer_approved:
            raise AlreadyVoted(
                f"{user.get_username()!r} already approved this question; it needs "
                f"{question.required_approvals - so_far} more approval(s) from other reviewers"
            )
        approvals = so_far + 1
        question.approvals_in_round = approvals  # as `selectors.with_approvals` reads it, for the response
        decision = {"kind": Decision.Kind.APPROVED, "detail": {"approvals": approvals,
                                                                "required": question.required_approvals}, **record}
        if approvals < question.required_approvals:
            decision_record(**decision)
            event_append(
                job_id=question.job_id, type="question", step=question.key, status="voted",
                message={"by": user.get_username(), "channel": channel, "approvals": approvals,
                         "required": question.required_approvals},
            )
            return
    question_settle(question=question, answer=answer, user=user, comment=comment, channel=channel, decision=decision)


def question_settle(
    *, question: Question, answer: Any, user: Any, comment: str, channel: str, decision: dict[str, Any],
    event_status: str = "answered", event_message: dict[str, Any] | None = None,
) -> Decision:
    """Mark `question` answered with `answer`, record the ledger row that decides it and resume
    its job: the one way a question is decided, by a person or (with `user` None) by a
    deadline's default. Returns the ledger row.

    `decision`: `decision_record`'s arguments for that row (its question, kind, actor, ...). The
    question's answer and the row are one statement (`decision_record(settles=True)`), and the
    question was answered at the row's `created_at` (the database's clock, which judges an
    answer's age: valid_for).

    Precondition: the caller is in a transaction holding the question's row lock.
    """
    question.status = Question.Status.ANSWERED
    question.answer = answer
    question.comment = comment or ""
    question.answered_by = user
    recorded = decision_record(**decision, settles=True)
    by = user.get_username() if user is not None else "system"
    # The question's event and the job's move to `pending` in one statement (`job_transition`'s `before`).
    job_resume(job_id=question.job_id, reason={"answered": question.key},
               before=("question", question.key, event_status,
                       event_message or {"by": by, "channel": channel, "answer": answer}))
    return recorded
