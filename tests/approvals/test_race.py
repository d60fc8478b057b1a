"""Races on the real database: two reviewers (or a reviewer and beat) act on one question in two
concurrent transactions. Exactly one wins; the other is told who answered first."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from approvals.models import Decision, Question
from approvals.schemas import approval
from approvals.services import AlreadyAnswered, QuestionClosed, question_answer, question_expire
from approvals.services import answering as answering_module
from jobs.models import Job
from tests.approvals.conftest import paused_on
from tests.conftest import make_user

# Real concurrency needs committed rows and a connection per thread. On PostgreSQL the question's
# row lock (SELECT … FOR UPDATE) decides; on SQLite, IMMEDIATE transactions make the second writer
# wait at BEGIN: the same outcome, the same assertions.
# The jobs run in this process: a session worker left running by an earlier test would claim
# them first (their messages go out at commit).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("only_own_workers")]


def run_together(*calls) -> list[Any]:
    """Run each call in its own thread (its own connection and transaction), released at once by
    a barrier; return what each returned or raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.fixture
def slow_validation(monkeypatch):
    """Hold the question's row lock a little longer, so the second transaction surely waits on it."""
    real = answering_module.answer_validate

    def slow(**kwargs):
        time.sleep(0.3)
        return real(**kwargs)

    monkeypatch.setattr(answering_module, "answer_validate", slow)


def test_two_reviewers_answer_at_once_and_exactly_one_wins(slow_validation):
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    job, question = paused_on({})
    results = run_together(
        lambda: question_answer(question_id=question.pk, user=ann, answer={"approved": True}),
        lambda: question_answer(question_id=question.pk, user=bob, answer={"approved": False, "reason": "no"}),
    )
    winners = [r for r in results if isinstance(r, Question)]
    losers = [r for r in results if isinstance(r, AlreadyAnswered)]
    assert len(winners) == 1 and len(losers) == 1, results
    question.refresh_from_db()
    first = question.answered_by.get_username()
    assert f"already answered by {first}" in losers[0].message
    assert Decision.objects.filter(question=question).count() == 1
    assert job.events.filter(type="status", status="pending").count() == 2  # submitted, resumed once
    assert Job.objects.get(pk=job.pk).status != "paused"  # resumed (a worker may already run it)


def test_two_approvals_of_a_quorum_at_once_both_count_and_resume_once(slow_validation):
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 2})
    results = run_together(
        lambda: question_answer(question_id=question.pk, user=ann, answer={"approved": True}),
        lambda: question_answer(question_id=question.pk, user=bob, answer={"approved": True}),
    )
    assert all(isinstance(r, Question) for r in results), results
    question.refresh_from_db()
    assert question.status == "answered" and sorted(question.approvers()) == ["ann", "bob"]
    assert job.events.filter(type="status", status="pending").count() == 2  # submitted, resumed once


def test_an_answer_racing_the_deadline_either_answers_or_is_refused(slow_validation):
    ann = make_user("ann", reviewer=True)
    job, question = paused_on({"timeout": 60})
    past_deadline = timezone.now() + timedelta(minutes=5)
    answered, expired = run_together(
        lambda: question_answer(question_id=question.pk, user=ann, answer={"approved": True}),
        lambda: (time.sleep(0.1), question_expire(question_id=question.pk, now=past_deadline))[1],
    )
    question.refresh_from_db()
    job.refresh_from_db()
    if isinstance(answered, Question):  # the reviewer was first: beat found nothing to do
        assert expired is None and question.status == "answered" and job.status != "paused"
    else:
        assert isinstance(answered, QuestionClosed) and expired == "fail"
        assert question.status == "expired" and job.status == "failed"
    assert Decision.objects.filter(question=question).count() == 1
