"""Every example kind, tested with `jobs.testing.run_kind`: in this process, no worker, no web
server, the test database. These are the examples a kind's author copies: the questions answered
with `answers`, the outside service played by `wait_results`, the deadlines and backup marks
passed on the test clock, and the replay check run on each (it is on by default)."""

from __future__ import annotations

import pytest

from approvals.models import Decision, Question
from demo.kinds import BatchReviewResult, Budget, ExpenseResult, Generation, ReceiptCheck, ReviewInput, ReviewResult
from jobs.errors import InvalidInput
from jobs.testing import EXPIRE, NEVER, Answer, HarnessError, Pending, WaitFailed, run_kind

pytestmark = pytest.mark.django_db


def test_noop_does_nothing():
    run = run_kind("demo.noop", {})
    assert (run.status, run.result, run.runs, run.step_runs) == ("completed", {}, 1, {})


def test_sleep_runs_each_step_once_and_reports_progress():
    run = run_kind("demo.sleep", {"seconds": 0, "steps": 3})
    assert run.status == "completed"
    assert run.result == {"slept": 0, "step_runs": {"1": 1, "2": 1, "3": 1}}
    assert run.step_runs == {"1": 1, "2": 1, "3": 1}
    assert [e["message"]["text"] for e in run.events if e["type"] == "progress"][-1] == "step 3 of 3"


def test_review_approved_returns_a_typed_result():
    run = run_kind("demo.review", ReviewInput(document="Q3 report"), answers={"approve": {"approved": True}})
    assert run.status == "completed"
    assert run.result == {"approved": True, "reviewer": "harness"}
    assert run.value == ReviewResult(approved=True, reviewer="harness")
    assert run.runs == 2  # asked (paused), then answered (resumed)
    assert [e["status"] for e in run.events if e["type"] == "status"] == [
        "pending", "processing", "paused", "pending", "processing", "completed"]


def test_review_rejected_by_a_named_reviewer():
    run = run_kind("demo.review", {"document": "Q3"},
                   answers={"approve": Answer({"approved": False, "reason": "typos"}, by="rita")})
    assert run.result == {"approved": False, "reviewer": "rita"}


def test_review_with_a_quorum_takes_distinct_reviewers():
    run = run_kind("demo.review", {"document": "Q3", "required_approvals": 3}, answers={"approve": {"approved": True}})
    assert run.status == "completed" and run.result["reviewer"] == "harness-3"
    approvers = Question.objects.get(job=run.job).approvers()
    assert approvers == ["harness", "harness-2", "harness-3"]


def test_review_past_its_deadline_fails_on_the_test_clock_without_sleeping():
    run = run_kind("demo.review", {"document": "Q3", "timeout": 3600}, answers={"approve": EXPIRE})
    assert run.status == "failed" and run.error["code"] == "question_expired"
    assert run.clock.offset.total_seconds() > 3500  # the clock moved an hour; the test took a moment
    assert Decision.objects.get(job=run.job).kind == "expired"


def test_review_refuses_invalid_input_as_the_api_would():
    with pytest.raises(InvalidInput) as refused:
        run_kind("demo.review", {"document": "Q3", "required_approvals": 9})
    assert refused.value.field == "input.required_approvals"


def test_expense_choice_form_and_quorum_approval():
    run = run_kind(
        "demo.expense", {"employee": "Dana", "amount": 120, "description": "Train to Lyon"},
        answers={
            "category": Budget.TRAVEL,
            "check": ReceiptCheck(amount=118.5, vat=19.75, receipt_attached=True),
            "approve": [Answer({"approved": True}, by="ann"), Answer({"approved": True}, by="bob")],
        },
    )
    assert run.status == "completed"
    assert run.value == ExpenseResult(approved=True, category=Budget.TRAVEL, approvers=["ann", "bob"], paid=118.5,
                                      currency="EUR")
    assert run.step_runs == {"pay": 1}
    assert run.runs == 4  # three questions, each a pause and a resume


def test_expense_rejection_says_why_and_pays_nothing():
    run = run_kind(
        "demo.expense", {"employee": "Dana", "amount": 99, "description": "Lunch", "approvals": 3},
        answers={"category": "other", "check": {"amount": 99, "receipt_attached": False},
                 "approve": Answer({"approved": False, "reason": "no receipt"}, by="ann")},
    )
    assert run.result == {"approved": False, "reason": "no receipt", "category": "other", "rejected_by": "ann"}
    assert run.step_runs == {}


def test_expense_unanswered_past_its_deadline_is_rejected_by_the_default_answer():
    run = run_kind(
        "demo.expense", {"employee": "Dana", "amount": 10, "description": "Taxi", "deadline_seconds": 600},
        answers={"category": "travel", "check": {"amount": 10, "receipt_attached": True}},  # no "approve"
    )
    assert run.result == {"approved": False, "reason": "no decision before the deadline", "category": "travel",
                          "rejected_by": "system"}


def test_generate_when_the_service_calls_back():
    run = run_kind("demo.generate", {"prompt": "a haiku", "delay": 5},
                   wait_results={"generate": Generation(text="queues hum at night")})
    assert run.status == "completed" and run.value == Generation(text="queues hum at night")
    waits = [(e["status"], e["message"].get("by")) for e in run.events if e["type"] == "wait"]
    assert waits == [("parked", None), ("woken", "callback"), ("checked", None), ("done", "callback")]
    assert run.clock.offset.total_seconds() == 0  # a callback needs no time to pass


def test_generate_still_pending_at_the_first_marks_is_found_by_a_backup_check():
    run = run_kind("demo.generate", {"prompt": "p", "delay": 5},
                   wait_results={"generate": Pending(checks=1, then={"text": "late"})})
    assert run.result == {"text": "late"}
    woken = [e["message"]["by"] for e in run.events if e["type"] == "wait" and e["status"] == "woken"]
    assert woken == ["schedule", "callback"]  # the 60 s mark found it pending; then it called back
    assert 55 < run.clock.offset.total_seconds() < 180


def test_generate_never_finishing_fails_at_the_last_mark():
    run = run_kind("demo.generate", {"prompt": "p", "delay": 5}, wait_results={"generate": NEVER})
    assert run.status == "failed" and run.error["code"] == "deadline_exceeded"
    assert round(run.clock.offset.total_seconds()) == 300


def test_generate_failed_by_the_service():
    run = run_kind("demo.generate", {"prompt": "p", "delay": 5}, wait_results={"generate": WaitFailed("GPU on fire")})
    assert run.status == "failed" and run.error["code"] == "external_failed"
    assert "GPU on fire" in run.error["message"]


def test_batch_review_gathers_one_review_per_document():
    documents = ["fine", "typos", "fine too"]
    run = run_kind(
        "demo.batch_review", {"documents": documents},
        # One answer function for every child's question: it sees the question and so its job.
        answers={"approve": lambda question: {"approved": "typos" not in question.job.input["document"]}},
    )
    assert run.status == "completed"
    assert run.value == BatchReviewResult(approved=[0, 2], rejected=[1])
    assert [child.spawn_key for child in run.children] == ["review.0", "review.1", "review.2"]
    assert {child.kind for child in run.children} == {"demo.review"}
    assert run.runs == 2  # spawned and parked, then woken once by the last review
    statuses = [e["status"] for e in run.events if e["type"] == "status"]
    assert statuses == ["pending", "processing", "waiting", "pending", "processing", "completed"]


def test_batch_review_with_a_review_nobody_can_answer_stops_the_test_saying_which():
    with pytest.raises(HarnessError, match="child 'review.1'.*question 'approve'"):
        run_kind("demo.batch_review", {"documents": ["a", "b"]},
                 answers={"approve": lambda q: EXPIRE if q.job.spawn_key == "review.1" else {"approved": True}})
