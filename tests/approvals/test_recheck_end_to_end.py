"""The re-check at use with a real Celery worker: each reason a stored answer is not used (a
reviewer removed from the group between two quorum votes, a deactivated reviewer, the quorum
raised in code, an approval older than `valid_for`) asks the question again as a new round while
the job stays paused; an answer after `expires_at` is refused before beat's pass."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from approvals.models import Decision, Question
from approvals.schemas import approval
from approvals.services import question_answer
from approvals.tasks import questions_enforce_deadlines
from jobs.models import Job
from jobs.services import job_submit
from tests.api.conftest import client_for
from tests.approvals.conftest import answer_group, member_of
from tests.approvals.test_end_to_end import open_question, status_of, wait_status
from tests.conftest import make_user
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
YES = {"approved": True}


def asked_again(job: Job, key: str, round_: int) -> Question:
    """The question once the worker asked it again (round `round_`) and the job paused on it."""
    def reopened() -> Question | None:
        question = Question.objects.filter(job=job, key=key, status="open", round=round_).first()
        return question if question is not None and status_of(job) == "paused" else None

    return wait_until(reopened, timeout=30, interval=0.05,
                      message=f"job {job.pk} did not ask {key!r} again; it is {status_of(job)}")


def paused_resumes(job: Job) -> int:
    return job.events.filter(type="status", status="pending").count()


def test_a_reviewer_removed_from_the_group_between_two_quorum_votes(worker):
    finance = answer_group("finance")
    ann, bob, cleo = (member_of(finance, name) for name in ("ann", "bob", "cleo"))
    job, _ = job_submit(kind="test.ask", input={"schema": approval(), "assignees": "group:finance",
                                                "required_approvals": 2})
    question = open_question(job, "q")
    question_answer(question_id=question.pk, user=ann, answer=YES)
    ann.groups.remove(finance)
    question_answer(question_id=question.pk, user=bob, answer=YES)
    question = asked_again(job, "q", 2)
    assert question.asked_again_because == "reviewer_no_longer_allowed" and question.approvers() == ["bob"]
    question_answer(question_id=question.pk, user=cleo, answer=YES)
    job = wait_status(job, "completed", "failed")
    assert job.status == "completed" and job.result["approvers"] == ["bob", "cleo"], (job.result, job.error)
    assert paused_resumes(job) == 3  # submitted, resumed after bob, resumed after cleo


def test_a_deactivated_reviewer(worker):
    ann, bob, cleo = (make_user(name, reviewer=True) for name in ("ann", "bob", "cleo"))
    job, _ = job_submit(kind="test.ask", input={"schema": approval(), "required_approvals": 2})
    question = open_question(job, "q")
    question_answer(question_id=question.pk, user=ann, answer=YES)
    ann.is_active = False
    ann.save(update_fields=["is_active"])
    question_answer(question_id=question.pk, user=bob, answer=YES)
    question = asked_again(job, "q", 2)
    assert question.asked_again_because == "reviewer_no_longer_allowed"
    assert "ann was deactivated" in question.asked_again_text()
    question_answer(question_id=question.pk, user=cleo, answer=YES)
    job = wait_status(job, "completed", "failed")
    assert job.result["approvers"] == ["bob", "cleo"], (job.result, job.error)


def test_the_quorum_raised_in_code(worker):
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    job, _ = job_submit(kind="test.ask_then_confirm", input={"required_approvals": 1})
    question_answer(question_id=open_question(job, "q").pk, user=ann, answer=YES)
    confirm = open_question(job, "confirm")
    Job.objects.filter(pk=job.pk).update(input={"required_approvals": 2})  # a deploy raised the quorum
    question_answer(question_id=confirm.pk, user=ann, answer=YES)
    question = asked_again(job, "q", 2)
    assert (question.asked_again_because, question.required_approvals, question.approvers()) == (
        "policy_changed", 2, ["ann"])
    question_answer(question_id=question.pk, user=bob, answer=YES)
    job = wait_status(job, "completed", "failed")
    assert job.status == "completed" and job.result["approvers"] == ["ann", "bob"], (job.result, job.error)
    assert Question.objects.get(job=job, key="confirm").round == 1  # its answer still held


def test_a_stale_approval_with_valid_for(worker):
    reviewer = make_user("reviewer", reviewer=True)
    job, _ = job_submit(kind="test.ask_then_confirm", input={"valid_for": 2})
    question_answer(question_id=open_question(job, "q").pk, user=reviewer, answer=YES)
    confirm = open_question(job, "confirm")
    time.sleep(2.2)  # `q`'s approval is older than its valid_for when the job next uses it
    question_answer(question_id=confirm.pk, user=reviewer, answer=YES)
    question = asked_again(job, "q", 2)
    assert question.asked_again_because == "approval_stale" and question.approvers() == []
    question_answer(question_id=question.pk, user=reviewer, answer=YES)  # fresh: used at once
    job = wait_status(job, "completed", "failed")
    assert job.status == "completed" and job.result["round"] == 2, (job.result, job.error)


def test_an_answer_after_expires_at(worker):
    reviewer = make_user("reviewer", reviewer=True)
    job, _ = job_submit(kind="test.ask", input={"timeout": 1})
    question = open_question(job, "q")
    wait_until(lambda: timezone.now() > question.expires_at, timeout=10, interval=0.05)
    response = client_for(reviewer).post(f"/api/questions/{question.pk}/answer/", {"answer": YES}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "question_expired", response.json()
    assert Question.objects.get(pk=question.pk).status == "open"  # beat's pass has not run
    time.sleep(0.3)
    assert status_of(job) == "paused"
    assert questions_enforce_deadlines() == 1
    job = wait_status(job, "failed")
    assert job.error["code"] == "question_expired"
    assert list(Decision.objects.filter(question=question).values_list("kind", "actor_name")) == [
        ("refused", "reviewer"), ("expired", "system")]
