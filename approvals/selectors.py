"""Reads: which questions a caller may see and answer, and the reviewer's inbox."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from accounts.assignment import assigned_to_user
from approvals.models import Decision, Question
from dbkit.kept import KeptRead

ANSWER_PERMISSION = "approvals.answer_question"


def kinds_allowing_self_approval() -> list[str]:
    """The job kinds whose submitter may answer their own job's questions."""
    from jobs.registry import kinds_all

    return [kind.name for kind in kinds_all() if kind.allow_self_approval]


def _may_answer_at_all(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm(ANSWER_PERMISSION))


def assigned_to(user: Any, *, per_row: bool = True) -> Q:
    """The condition "the question is assigned to `user`, directly or through one of their
    groups", for a filter or (wrapped) an annotation: checked question by question, or with
    `per_row=False` as the planner likes, for a list or a count over many (`accounts.assignment`)."""
    return assigned_to_user(users=Question.assigned_users.through, groups=Question.assigned_groups.through,
                            row_field="question_id", user=user, per_row=per_row)


def _answerable(user: Any, *, per_row: bool) -> Q | None:
    """The condition of `questions_answerable_by` on a question's own row (None: no question)."""
    if not _may_answer_at_all(user):
        return None
    condition = Q(job__owner__isnull=True) | ~Q(job__owner=user) | Q(job__kind__in=kinds_allowing_self_approval())
    return condition if user.is_superuser else assigned_to(user, per_row=per_row) & condition


def questions_answerable_by(user: Any, *, per_row: bool = False) -> QuerySet[Question]:
    """Questions `user` may answer (whatever their status): for holders of the answer permission,
    those assigned to them directly or through one of their groups (every question for a
    superuser), except the questions of their own jobs when the job's kind does not allow
    self-approval. The same rule as `question_check_can_answer`, as a query.

    For a list or a count (the inbox), the planner checks the assignments as it likes; `per_row`
    for a read of a few rows (a job's visibility: `approvals.extensions`), question by question."""
    condition = _answerable(user, per_row=per_row)
    return Question.objects.none() if condition is None else Question.objects.filter(condition)


def questions_waiting_for(user: Any) -> QuerySet[Question]:
    """The inbox: open questions `user` may answer and has not yet approved (a quorum question
    they approved waits for others, not for them)."""
    voted = Decision.objects.filter(
        question_id=OuterRef("pk"), round=OuterRef("round"), kind=Decision.Kind.APPROVED, actor_id=user.pk
    )
    return questions_answerable_by(user).filter(status=Question.Status.OPEN).exclude(Exists(voted))


def questions_waiting_count(user: Any) -> int:
    """How many questions wait for `user` (one COUNT query; none without the permission)."""
    if not _may_answer_at_all(user):
        return 0
    return questions_waiting_for(user).count()


def questions_visible_to(user: Any, *, per_row: bool = False) -> QuerySet[Question]:
    """Questions `user` may see: those they may answer, and those of jobs they created (all
    for staff). `per_row` for a read of one question or a few, as for `questions_answerable_by`."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Question.objects.none()
    if user.is_staff:
        return Question.objects.all()
    # One condition on the question's own row, not `pk IN (every answerable question)`: a set
    # PostgreSQL would build whole for each read of one question.
    answerable, theirs = _answerable(user, per_row=per_row), Q(job__owner=user)
    return Question.objects.filter(theirs if answerable is None else answerable | theirs)


def with_approvals(questions: QuerySet[Question]) -> QuerySet[Question]:
    """`questions`, each with `approvals_in_round`: its approving votes in its current round, read
    in the same query (a list shows it for every row: one COUNT per question otherwise)."""
    votes = (
        Decision.objects.filter(question_id=OuterRef("pk"), round=OuterRef("round"), kind=Decision.Kind.APPROVED)
        .order_by().values("question_id").annotate(votes=Count("pk")).values("votes")
    )
    return questions.annotate(approvals_in_round=Coalesce(Subquery(votes), 0))


def _visible_one(user: Any, question_id: Any, job_id_only: bool = False) -> QuerySet[Question]:
    visible = questions_visible_to(user, per_row=True).filter(pk=question_id).order_by()
    return visible.values_list("job_id") if job_id_only else visible.select_related("answered_by")


# `question_get_visible` runs on every answer and every question page: its statement is built once
# per connection (dbkit.kept) for each *shape* of user, everything about them that decides its
# text: staff (who see every question, so nothing else about them matters), else superuser or not,
# whether they may answer at all, and the kinds that allow self-approval. Their id is the read's
# value. Each shape has two reads: the whole question, and only its job's id (`question_visible_job_id`).
_VISIBLE_READS: dict[tuple, KeptRead] = {}
_STAFF = (True, False, False, ())


def _visible_read(user: Any, job_id_only: bool = False) -> KeptRead:
    shape = _STAFF if user.is_staff else (
        False, user.is_superuser, _may_answer_at_all(user), tuple(kinds_allowing_self_approval()))
    read = _VISIBLE_READS.get((shape, job_id_only))
    if read is None:
        is_staff, is_superuser, may_answer, _ = shape

        def build(question_id: Any, user_id: Any = None) -> QuerySet[Question]:
            stand_in = get_user_model()(pk=user_id, is_staff=is_staff, is_superuser=is_superuser, is_active=True)
            stand_in._perm_cache = {ANSWER_PERMISSION} if may_answer else set()
            return _visible_one(stand_in, question_id, job_id_only)

        # For staff the user's id is not in the statement.
        read = _VISIBLE_READS[shape, job_id_only] = KeptRead(build, stand_ins=(uuid.UUID(int=0),) if is_staff
                                                             else (uuid.UUID(int=0), -1))
    if settings.KEPT_READS_CHECK:  # the shape must hold everything of the user's that the statement uses
        stand_in = read.build(uuid.UUID(int=0), user.pk).query.sql_with_params()
        assert _visible_one(user, uuid.UUID(int=0), job_id_only).query.sql_with_params() == stand_in, (
            shape, stand_in)
    return read


def question_get_visible(*, user: Any, question_id: Any) -> Question:
    """The question `question_id` if `user` may see it; QuestionNotFound otherwise (as if it did
    not exist)."""
    return _visible_row(user, question_id, job_id_only=False)


def question_visible_job_id(*, user: Any, question_id: Any) -> Any:
    """The id of the job of question `question_id` if `user` may see the question;
    QuestionNotFound otherwise, as `question_get_visible`. For a caller that goes on to read the
    question again under its lock (an answer): the question's prompt, schema and details (up to
    the size of a document under review) are not read twice."""
    return _visible_row(user, question_id, job_id_only=True)[0]


def _visible_row(user: Any, question_id: Any, *, job_id_only: bool) -> Any:
    from approvals.services import QuestionNotFound

    try:
        if user is None or not user.is_authenticated or not user.is_active:
            found = None
        else:
            values = (question_id,) if user.is_staff else (question_id, user.pk)
            found = _visible_read(user, job_id_only).rows(*values, using=Question.objects.db)
    except (ValueError, TypeError, ValidationError):  # not a UUID
        found = None
    if not found:
        raise QuestionNotFound(f"question {question_id} does not exist")
    return found[0]


def question_decisions(question: Question) -> QuerySet[Decision]:
    """The ledger rows of `question`, oldest first."""
    return Decision.objects.filter(question=question).select_related("actor").order_by("created_at", "id")
