"""Question types: each helper's schema, validated on the server before the job resumes; and what
`ctx.ask` refuses before a job pauses."""

from __future__ import annotations

import pytest

from approvals.schemas import (
    APPROVAL_SCHEMA,
    QuestionType,
    approval,
    choice,
    form,
    is_flat_object,
    multiple_choice,
    question_type,
    text,
)
from approvals.services import InvalidAnswer, question_answer
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.approvals.conftest import paused_on

pytestmark = pytest.mark.django_db

EXPENSE_FORM = form({
    "type": "object",
    "properties": {
        "amount": {"type": "number", "minimum": 0},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "ok": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 10},
        "budget": {"type": "string", "enum": ["a", "b"]},
    },
    "required": ["amount", "ok"],
    "additionalProperties": False,
})


@pytest.mark.parametrize(
    "schema, kind",
    [
        (approval(), QuestionType.APPROVAL),
        (APPROVAL_SCHEMA, QuestionType.APPROVAL),
        (choice(["a", "b"]), QuestionType.CHOICE),
        ({"enum": ["x", "y"]}, QuestionType.CHOICE),
        (multiple_choice(["a", "b", "c"], min_items=1, max_items=2), QuestionType.MULTIPLE_CHOICE),
        ({"type": "array", "items": {"enum": [1, 2]}}, QuestionType.MULTIPLE_CHOICE),
        (text(max_length=20), QuestionType.TEXT),
        ({"type": "string"}, QuestionType.TEXT),
        (EXPENSE_FORM, QuestionType.FORM),
        ({"type": "object", "properties": {"a": {"type": "object"}}}, QuestionType.FORM),
    ],
)
def test_the_type_of_a_schema_is_its_mark_or_its_shape(schema, kind):
    assert question_type(schema) == kind


def test_flat_and_nested_forms():
    assert is_flat_object(EXPENSE_FORM)
    assert not is_flat_object(form({"type": "object", "properties": {"a": {"type": "object"}}}))


@pytest.mark.parametrize(
    "call",
    [
        lambda: choice([]),
        lambda: choice(["a", "a"]),
        lambda: multiple_choice(["a", "b"], min_items=3),
        lambda: multiple_choice(["a", "b"], max_items=0),
        lambda: text(max_length=0),
        lambda: form({"type": "nonsense"}),
    ],
)
def test_helpers_refuse_impossible_questions(call):
    with pytest.raises(Exception):  # noqa: B017 (ValueError or jsonschema's SchemaError)
        call()


@pytest.mark.parametrize(
    "schema, good, bad, field",
    [
        (approval(), {"approved": False, "reason": "typo on p. 2"}, {"approved": False}, "answer"),
        (approval(), {"approved": True}, {"approved": False, "reason": ""}, "answer.reason"),
        (choice({"fast": "Fast", "cheap": "Cheap"}), "cheap", "good", "answer"),
        (multiple_choice(["a", "b", "c"], min_items=1, max_items=2), ["a", "c"], ["a", "b", "c"], "answer"),
        (multiple_choice(["a", "b", "c"], min_items=1), ["b"], [], "answer"),
        (multiple_choice(["a", "b"]), ["a"], ["a", "a"], "answer"),
        (text(max_length=5), "short", "too long", "answer"),
        (EXPENSE_FORM, {"amount": 3.5, "ok": True}, {"amount": -1, "ok": True}, "answer.amount"),
        (EXPENSE_FORM, {"amount": 1, "ok": False, "budget": "b"}, {"amount": 1, "ok": True, "x": 1}, "answer"),
    ],
)
def test_each_type_is_validated_by_the_answer_service(reviewer, schema, good, bad, field):
    job, question = paused_on({"schema": schema})
    with pytest.raises(InvalidAnswer) as refused:
        question_answer(question_id=question.pk, user=reviewer, answer=bad)
    assert refused.value.field == field
    assert Job.objects.get(pk=job.pk).status == "paused"
    question_answer(question_id=question.pk, user=reviewer, answer=good)
    assert Job.objects.get(pk=job.pk).status == "pending"
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "completed" and job.result["answer"] == good and job.result["by"] == "reviewer"


@pytest.mark.parametrize(
    "input, code",
    [
        ({"schema": {"type": "bogus"}}, "invalid_question"),
        ({"required_approvals": 0}, "invalid_question"),
        ({"schema": text(), "required_approvals": 2}, "invalid_question"),
        ({"timeout": -5}, "invalid_question"),
        ({"on_timeout": {"action": "fail"}}, "invalid_question"),  # a policy without a timeout
        ({"schema": choice(["a"]), "timeout": 5, "on_timeout": {"action": "default", "answer": "b"}},
         "invalid_question"),
        ({"assignees": ["nobody-by-this-name"]}, "unknown_assignee"),
        ({"assignees": "group:no-such-group"}, "unknown_assignee"),
        ({"timeout": 5, "on_timeout": {"action": "escalate", "to": "group:ghosts"}}, "unknown_assignee"),
    ],
)
def test_ask_refuses_a_broken_question_before_pausing(input, code):
    job, _ = job_submit(kind="test.ask", input=input)
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == code, job.error
    assert not job.questions.exists()
