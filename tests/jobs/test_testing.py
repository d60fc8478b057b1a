"""`jobs.testing`, the harness job authors test their kinds with: it runs a kind in this process
(no Celery, no web server), plays questions, waits and children as the platform does, moves a
test clock past deadlines, and holds the kind to the replay rule."""

from __future__ import annotations

import pytest

from approvals.models import Decision
from approvals.schemas import approval
from jobs.models import Job
from jobs.testing import EXPIRE, Answer, Clock, HarnessError, NonDeterminism, run_kind

pytestmark = pytest.mark.django_db


def test_a_deterministic_kind_passes_the_replay_check_and_counts_its_steps():
    run = run_kind("test.deterministic", {}, answers={"approve": {"approved": True}})
    assert run.status == "completed"
    assert run.result["total"] == run.result["draw"] * 2 and run.result["approved"] is True
    assert run.step_runs == {"draw": 1, "total": 1}  # `draw` ran once although the handler ran twice
    assert run.runs == 2
    assert [str(call) for call in run.calls][:1] == ["ctx.step('draw')"]


def test_the_replay_check_catches_a_step_order_that_differs():
    with pytest.raises(NonDeterminism) as caught:
        run_kind("test.nondeterministic_order", {})
    message = str(caught.value)
    assert "test.nondeterministic_order" in message and "not deterministic" in message
    assert "replay from checkpoint 0" in message
    assert "ctx.step('b')" in message and "ctx.step('a')" in message
    assert "Code outside ctx.step runs again on every resume" in message


def test_the_replay_check_catches_a_changed_question():
    with pytest.raises(NonDeterminism) as caught:
        run_kind("test.nondeterministic_prompt", {}, answers={"approve": {"approved": True}})
    message = str(caught.value)
    assert "in run 2, ctx call #2 was ctx.ask('approve'" in message
    assert "where run 1 made ctx.ask('approve'" in message
    # The platform itself refused to reuse the answer for the changed question.
    assert Job.objects.get().error["code"] == "question_changed"


def test_without_the_replay_check_the_same_kind_just_fails_as_the_platform_would():
    run = run_kind("test.nondeterministic_prompt", {}, answers={"approve": {"approved": True}}, replay_check=False)
    assert run.status == "failed" and run.error["code"] == "question_changed"


def test_a_question_without_an_answer_or_a_deadline_stops_the_run_with_a_clear_message():
    with pytest.raises(HarnessError, match=r"paused on question 'approve' \('Approve this document\?'\)"):
        run_kind("demo.review", {"document": "x"})


def test_a_wait_without_a_result_stops_the_run_with_a_clear_message():
    with pytest.raises(HarnessError, match=r"waits on 'generate' but wait_results has no 'generate'"):
        run_kind("demo.generate", {"prompt": "p", "delay": 1})


def test_the_clock_runs_an_escalation_and_its_own_deadline_without_sleeping():
    escalate = {"action": "escalate", "to": "group:managers", "timeout": 7200, "then": {"action": "fail"}}
    from django.contrib.auth.models import Group

    Group.objects.create(name="managers")
    run = run_kind("test.ask", {"schema": approval(), "timeout": 3600, "on_timeout": escalate},
                   answers={"q": EXPIRE})
    assert run.status == "failed" and run.error["code"] == "question_expired"
    assert list(Decision.objects.filter(job=run.job).values_list("kind", flat=True)) == ["escalated", "expired"]
    assert 3 * 3600 - 100 < run.clock.offset.total_seconds() < 3 * 3600 + 100


def test_a_clock_given_by_the_test_is_the_one_moved():
    clock = Clock()
    clock.advance(hours=1)
    run = run_kind("test.ask", {"timeout": 60, "on_timeout": {"action": "default", "answer": {"approved": True}}},
                   clock=clock)
    assert run.result["by"] == "system" and run.clock is clock
    assert 3600 + 55 < clock.offset.total_seconds() < 3600 + 120


def test_retries_run_at_once_and_finished_steps_stay_done():
    # test.flaky counts the runs of its body outside any step, on purpose: not a replayable result.
    run = run_kind("test.flaky", {"fail_times": 2}, replay_check=False)
    assert run.status == "completed" and run.runs == 3
    assert run.step_runs == {"a": 1}
    assert [e["status"] for e in run.events if e["type"] == "status"].count("pending") == 3


def test_answers_by_a_function_and_by_named_reviewers():
    run = run_kind("test.ask", {"prompt": "Which?", "schema": {"enum": ["x", "y"]}},
                   answers={"q": lambda question: Answer("y" if question.prompt == "Which?" else "x", by="olga")})
    assert run.result["answer"] == "y" and run.result["by"] == "olga"


def test_nothing_is_sent_to_celery(monkeypatch):
    sent = []
    monkeypatch.setattr("jobs.tasks.job_run.apply_async", lambda *args, **kwargs: sent.append(args))
    monkeypatch.setattr("jobs.services.transitions.run_message_send", lambda task, job_id, options: sent.append(job_id))
    with pytest.MonkeyPatch.context():
        run_kind("test.fanout", {"noop": 3})
    assert sent == []
