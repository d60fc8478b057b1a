"""Reads: which questions a caller may see and answer, and the reviewer's inbox."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from approvals.models import Decision, Question

ANSWER_PERMISSION = "approvals.answer_question"


def kinds_allowing_self_approval() -> list[str]:
    """The job kinds whose submitter may answer their own job's questions."""
    from jobs.registry import kinds_all

    return [kind.name for kind in kinds_all() if kind.allow_self_approval]


def _may_answer_at_all(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm(ANSWER_PERMISSION))


def assigned_to(user: Any) -> Q:
    """The condition "the question is assigned to `user`, directly or through one of their
    groups", for a filter or (wrapped) an annotation."""
    by_user = Question.assigned_users.through.objects.filter(question_id=OuterRef("pk"), user_id=user.pk)
    by_group = Question.assigned_groups.through.objects.filter(question_id=OuterRef("pk"), group__user=user)
    return Q(Exists(by_user)) | Q(Exists(by_group))


def questions_answerable_by(user: Any) -> QuerySet[Question]:
    """Questions `user` may answer (whatever their status): for holders of the answer permission,
    those assigned to them directly or through one of their groups (every question for a
    superuser), except the questions of their own jobs when the job's kind does not allow
    self-approval. The same rule as `question_check_can_answer`, as a query."""
    if not _may_answer_at_all(user):
        return Question.objects.none()
    questions = Question.objects.all()
    if not user.is_superuser:
        questions = questions.filter(assigned_to(user))
    return questions.filter(
        Q(job__owner__isnull=True) | ~Q(job__owner=user) | Q(job__kind__in=kinds_allowing_self_approval())
    )


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


def questions_visible_to(user: Any) -> QuerySet[Question]:
    """Questions `user` may see: those they may answer, and those of jobs they created (all
    for staff)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Question.objects.none()
    if user.is_staff:
        return Question.objects.all()
    return Question.objects.filter(Q(pk__in=questions_answerable_by(user).values("pk")) | Q(job__owner=user))


def with_approvals(questions: QuerySet[Question]) -> QuerySet[Question]:
    """`questions`, each with `approvals_in_round`: its approving votes in its current round, read
    in the same query (a list shows it for every row: one COUNT per question otherwise)."""
    votes = (
        Decision.objects.filter(question_id=OuterRef("pk"), round=OuterRef("round"), kind=Decision.Kind.APPROVED)
        .order_by().values("question_id").annotate(votes=Count("pk")).values("votes")
    )
    return questions.annotate(approvals_in_round=Coalesce(Subquery(votes), 0))


def question_get_visible(*, user: Any, question_id: Any) -> Question:
    """The question `question_id` if `user` may see it; QuestionNotFound otherwise (as if it did
    not exist)."""
    from approvals.services import QuestionNotFound

    try:
        question = questions_visible_to(user).select_related("answered_by").filter(pk=question_id).first()
    except (ValueError, TypeError, ValidationError):  # not a UUID
        question = None
    if question is None:
        raise QuestionNotFound(f"question {question_id} does not exist")
    return question


def question_decisions(question: Question) -> QuerySet[Decision]:
    """The ledger rows of `question`, oldest first."""
    return Decision.objects.filter(question=question).select_related("actor").order_by("created_at", "id")
