"""Reads: which questions a caller may see and answer."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet

from approvals.models import Question

ANSWER_PERMISSION = "approvals.answer_question"


def questions_answerable_by(user: Any) -> QuerySet[Question]:
    """Questions `user` may answer (today: every question, for holders of the answer
    permission; assignees narrow this)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Question.objects.none()
    if user.has_perm(ANSWER_PERMISSION):
        return Question.objects.all()
    return Question.objects.none()


def questions_visible_to(user: Any) -> QuerySet[Question]:
    """Questions `user` may see: those they may answer, and those of jobs they created (all
    for staff)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Question.objects.none()
    if user.is_staff:
        return Question.objects.all()
    return Question.objects.filter(Q(pk__in=questions_answerable_by(user).values("pk")) | Q(job__owner=user))


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
