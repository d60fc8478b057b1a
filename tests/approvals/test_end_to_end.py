"""The reviewers' side with a real Celery worker, the real database and Redis: the example kind
(choice, form, quorum) answered through the admin, the API and the services; and each deadline
policy with short deadlines, enforced by beat's task (called here as beat would)."""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import Decision, Question
from approvals.schemas import approval
from approvals.services import question_answer
from approvals.tasks import questions_enforce_deadlines
from jobs.models import Job
from jobs.services import job_submit
from tests.api.conftest import client_for
from tests.approvals.conftest import answer_group, member_of
from tests.conftest import make_user
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def status_of(job: Job) -> str | None:
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()


def wait_status(job: Job, *statuses: str, timeout: float = 30.0) -> Job:
    wait_until(lambda: status_of(job) in statuses, timeout=timeout,
               message=f"job {job.pk} did not reach {statuses}; it is {status_of(job)}")
    return Job.objects.get(pk=job.pk)


def open_question(job: Job, key: str) -> Question:
    wait_until(lambda: Question.objects.filter(job=job, key=key, status="open").exists() and status_of(job) == "paused",
               timeout=30, message=f"job {job.pk} did not pause on {key!r}; it is {status_of(job)}")
    return Question.objects.get(job=job, key=key)


def test_the_expense_example_with_choice_form_and_quorum(worker):
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    clerk = make_user("clerk")
    job, _ = job_submit(kind="demo.expense", owner=clerk,
                        input={"employee": "Dana", "amount": 120.0, "description": "Train to Lyon", "approvals": 2})
    # 1. The budget, chosen in the admin with the radio buttons.
    category = open_question(job, "category")
    browser = Client()
    browser.force_login(ann)
    page = browser.get(reverse("admin:approvals_question_change", args=[category.pk])).content.decode()
    assert 'type="radio"' in page and "Train to Lyon" in page
    browser.post(reverse("admin:approvals_question_answer", args=[category.pk]), {"choice": json.dumps("travel")})
    # 2. The amounts, corrected through the API.
    check = open_question(job, "check")
    response = client_for(bob).post(f"/api/questions/{check.pk}/answer/",
                                    {"answer": {"amount": 118.5, "vat": 19.75, "receipt_attached": True}},
                                    format="json")
    assert response.status_code == 200, response.json()
    # 3. Two distinct approvals: the first leaves the job paused, the second resumes it.
    approve = open_question(job, "approve")
    assert approve.required_approvals == 2 and "118.50 EUR" in approve.prompt
    question_answer(question_id=approve.pk, user=ann, answer={"approved": True})
    time.sleep(0.5)
    assert status_of(job) == "paused"
    question_answer(question_id=approve.pk, user=bob, answer={"approved": True, "reason": "receipt checked"})
    job = wait_status(job, "completed", "failed")
    assert job.status == "completed", job.error
    assert job.result == {"approved": True, "category": "travel", "approvers": ["ann", "bob"], "paid": 118.5,
                          "currency": "EUR"}
    kinds = list(Decision.objects.filter(job=job).values_list("question__key", "kind", "actor_name", "channel"))
    assert kinds == [("category", "answered", "ann", "admin"), ("check", "answered", "bob", "api"),
                     ("approve", "approved", "ann", "admin"), ("approve", "approved", "bob", "admin")]


def test_a_rejection_ends_the_expense_at_once(worker):
    ann = make_user("ann", reviewer=True)
    job, _ = job_submit(kind="demo.expense",
                        input={"employee": "Dana", "amount": 99.0, "description": "Lunch", "approvals": 3})
    question_answer(question_id=open_question(job, "category").pk, user=ann, answer="other")
    question_answer(question_id=open_question(job, "check").pk, user=ann,
                    answer={"amount": 99.0, "receipt_attached": False})
    question_answer(question_id=open_question(job, "approve").pk, user=ann,
                    answer={"approved": False, "reason": "no receipt"})
    job = wait_status(job, "completed", "failed")
    assert job.result == {"approved": False, "reason": "no receipt", "category": "other", "rejected_by": "ann"}


def expire(question: Question) -> None:
    """Wait for the (short) deadline, then run beat's task as beat would."""
    wait_until(lambda: timezone.now() > question.expires_at, timeout=10, interval=0.05)
    assert questions_enforce_deadlines() >= 1


@pytest.mark.parametrize(
    "policy, final, check",
    [
        ({"action": "default", "answer": {"approved": False, "reason": "timed out"}}, "completed",
         lambda job: job.result["answer"] == {"approved": False, "reason": "timed out"}
         and job.result["by"] == "system"),
        ({"action": "fail"}, "failed", lambda job: job.error["code"] == "question_expired"),
        ({"action": "cancel"}, "cancelled", lambda job: job.error is None),
    ],
    ids=["default", "fail", "cancel"],
)
def test_each_deadline_policy_with_a_short_deadline(worker, policy, final, check):
    job, _ = job_submit(kind="test.ask", input={"schema": approval(), "timeout": 1, "on_timeout": policy})
    question = open_question(job, "q")
    expire(question)
    job = wait_status(job, final)
    assert check(job), (job.result, job.error)
    decision = Decision.objects.get(question=question)
    assert (decision.kind, decision.actor_id, decision.channel) == ("expired", None, "system")


def test_escalation_reassigns_then_the_new_assignee_answers(worker):
    boss = member_of(answer_group("managers"), "boss")
    make_user("rita", reviewer=True)
    escalate = {"action": "escalate", "to": "group:managers", "timeout": 1, "then": {"action": "fail"}}
    job, _ = job_submit(kind="test.ask", input={"timeout": 1, "on_timeout": escalate})
    question = open_question(job, "q")
    expire(question)
    question.refresh_from_db()
    assert question.status == "open" and question.assignee_names() == ["group:managers"]
    assert status_of(job) == "paused"
    question_answer(question_id=question.pk, user=boss, answer={"approved": True})
    job = wait_status(job, "completed")
    assert job.result["by"] == "boss"
    assert list(Decision.objects.filter(question=question).values_list("kind", flat=True)) == ["escalated", "approved"]


def test_an_unanswered_escalation_applies_its_own_policy(worker):
    answer_group("managers")
    escalate = {"action": "escalate", "to": "group:managers", "timeout": 1, "then": {"action": "fail"}}
    job, _ = job_submit(kind="test.ask", input={"timeout": 1, "on_timeout": escalate})
    question = open_question(job, "q")
    expire(question)
    question.refresh_from_db()
    expire(question)
    job = wait_status(job, "failed")
    assert job.error["code"] == "question_expired"
    assert list(Decision.objects.filter(question=question).values_list("kind", flat=True)) == ["escalated", "expired"]
