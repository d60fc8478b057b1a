"""Deadlines through the services: beat's task applies each `on_timeout` policy as the system,
with a ledger row; questions answered in time, or not yet due, are left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from approvals.models import Decision, Question
from approvals.schemas import approval, choice
from approvals.services import NotAllowedToAnswer, QuestionClosed, question_answer, questions_expire_due
from approvals.tasks import questions_enforce_deadlines
from jobs.models import JobEvent
from jobs.runner import job_execute
from tests.approvals.conftest import answer_group, member_of, paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def later(seconds: float = 3600):
    return timezone.now() + timedelta(seconds=seconds)


def test_beat_runs_the_deadline_task_on_its_interval():
    entry = settings.CELERY_BEAT_SCHEDULE["approvals-enforce-deadlines"]
    assert entry == {"task": "approvals.enforce_deadlines", "schedule": settings.APPROVALS_DEADLINE_INTERVAL}
    assert questions_enforce_deadlines.name == "approvals.enforce_deadlines"


def test_the_deadline_is_set_when_the_question_opens():
    before = timezone.now()
    _, question = paused_on({"timeout": 600})
    assert before + timedelta(seconds=599) < question.expires_at < timezone.now() + timedelta(seconds=601)
    assert question.on_timeout == {"action": "fail"}


def test_nothing_happens_before_the_deadline_or_after_an_answer(reviewer):
    _, waiting = paused_on({"timeout": 600})
    _, answered = paused_on({"key": "other", "timeout": 1})
    question_answer(question_id=answered.pk, user=reviewer, answer={"approved": True})
    assert questions_expire_due(now=later(60)) == 0
    assert Question.objects.get(pk=waiting.pk).status == "open"
    assert not Decision.objects.filter(kind__in=["expired", "escalated"]).exists()


def test_default_answers_as_the_system_and_the_job_resumes_the_same_way():
    schema = choice(["ship", "hold"])
    job, question = paused_on({"schema": schema, "timeout": 60, "on_timeout": {"action": "default", "answer": "hold"}})
    assert questions_expire_due(now=later()) == 1
    question.refresh_from_db()
    assert question.status == "answered" and question.answer == "hold" and question.answered_by is None
    decision = Decision.objects.get(question=question)
    assert (decision.kind, decision.actor, decision.actor_name, decision.channel, decision.answer) == (
        "expired", None, "system", "system", "hold")
    job.refresh_from_db()
    assert job.status == "pending"
    statuses = list(job.events.order_by("seq").values_list("type", "status"))
    assert statuses[-2:] == [("question", "expired"), ("status", "pending")]
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "completed" and job.result == {"answer": "hold", "by": "system", "approvers": [], "round": 1}


def test_fail_fails_the_job_with_question_expired():
    job, question = paused_on({"timeout": 60})  # Fail is the default policy
    assert questions_expire_due(now=later()) == 1
    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "question_expired"
    assert Question.objects.get(pk=question.pk).status == "expired"
    assert Decision.objects.get(question=question).detail == {"on_timeout": "fail"}


def test_cancel_cancels_the_job(reviewer):
    job, question = paused_on({"timeout": 60, "on_timeout": {"action": "cancel"}})
    questions_expire_due(now=later())
    job.refresh_from_db()
    assert job.status == "cancelled"
    with pytest.raises(QuestionClosed, match="expired"):
        question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})


def test_escalate_reassigns_with_a_new_deadline_then_applies_its_own_policy(reviewer):
    answer_group("managers")
    escalation = {"action": "escalate", "to": "group:managers", "timeout": 120, "then": {"action": "cancel"}}
    job, question = paused_on({"timeout": 60, "on_timeout": escalation})
    first = later(61)
    assert questions_expire_due(now=first) == 1
    question.refresh_from_db()
    assert question.status == "open" and question.assignee_names() == ["group:managers"]
    assert question.expires_at > timezone.now() + timedelta(seconds=100)
    assert question.on_timeout == {"action": "cancel"}
    assert job.events.filter(type="question", status="escalated").exists()
    decision = Decision.objects.get(question=question)
    assert decision.kind == "escalated" and decision.detail["to"] == ["group:managers"]
    # The reviewers lost it; the managers have it.
    with pytest.raises(NotAllowedToAnswer):
        question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    assert questions_expire_due(now=later(3600)) == 1
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert list(Decision.objects.filter(question=question).values_list("kind", flat=True)) == ["escalated", "expired"]


def test_an_escalated_question_can_be_answered_by_the_new_assignees():
    boss = member_of(answer_group("managers"), "boss")
    job, question = paused_on({"schema": approval(), "timeout": 60,
                               "on_timeout": {"action": "escalate", "to": ["boss"]}})
    questions_expire_due(now=later())
    question.refresh_from_db()
    assert question.expires_at is None  # no new deadline: it waits for the boss
    question_answer(question_id=question.pk, user=boss, answer={"approved": True})
    assert JobEvent.objects.filter(job=job, type="status").last().status == "pending"


def test_one_broken_question_does_not_stop_beat(monkeypatch):
    _, question = paused_on({"timeout": 60})
    calls = []

    def broken(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("boom")

    monkeypatch.setattr("approvals.services.deadlines.question_expire", broken)
    assert questions_expire_due(now=later()) == 0 and len(calls) == 1
    assert Question.objects.get(pk=question.pk).status == "open"


def test_quorum_votes_survive_an_escalation():
    voter = make_user("voter", reviewer=True)
    boss = member_of(answer_group("managers"), "boss")
    job, question = paused_on({"schema": approval(), "required_approvals": 2, "timeout": 60,
                               "assignees": ["voter"], "on_timeout": {"action": "escalate", "to": "group:managers"}})
    question_answer(question_id=question.pk, user=voter, answer={"approved": True})
    questions_expire_due(now=later())
    question_answer(question_id=question.pk, user=boss, answer={"approved": True})
    question.refresh_from_db()
    assert question.status == "answered" and question.approvers() == ["voter", "boss"]
