"""Answering questions: validation, who may answer, answering twice."""

import pytest

from approvals.models import Question
from approvals.services import AlreadyAnswered, InvalidAnswer, NotAllowedToAnswer, QuestionClosed, question_answer
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_cancel, job_submit
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def paused_review():
    job, _ = job_submit(kind="demo.review", input={"document": "d"})
    job_execute(job_id=job.pk)
    return job, Question.objects.get(job=job)


@pytest.mark.parametrize(
    "answer, field",
    [
        ({"approved": "yes"}, "answer.approved"),
        ({}, "answer"),
        ({"approved": True, "x": 1}, "answer"),
        ("ok", "answer"),
    ],
)
def test_an_answer_that_fails_the_schema_is_refused_and_the_job_stays_paused(paused_review, reviewer, answer, field):
    job, question = paused_review
    with pytest.raises(InvalidAnswer) as info:
        question_answer(question_id=question.pk, user=reviewer, answer=answer)
    assert info.value.field == field
    question.refresh_from_db()
    assert question.status == "open" and question.answer is None
    assert Job.objects.get(pk=job.pk).status == "paused"


def test_answering_twice_is_refused_naming_who_answered(paused_review, reviewer):
    _, question = paused_review
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": False, "reason": "typos"})
    other = make_user("other", reviewer=True)
    with pytest.raises(AlreadyAnswered, match="already answered by reviewer"):
        question_answer(question_id=question.pk, user=other, answer={"approved": True})
    question.refresh_from_db()
    assert question.answered_by.username == "reviewer" and question.answer == {"approved": False, "reason": "typos"}


def test_a_user_without_the_permission_may_not_answer(paused_review, submitter):
    _, question = paused_review
    with pytest.raises(NotAllowedToAnswer, match="answer_question"):
        question_answer(question_id=question.pk, user=submitter, answer={"approved": True})


def test_a_cancelled_job_cancels_its_questions_and_refuses_answers(paused_review, reviewer):
    job, question = paused_review
    job_cancel(job_id=job.pk)
    question.refresh_from_db()
    assert question.status == "cancelled"
    with pytest.raises(QuestionClosed):
        question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
