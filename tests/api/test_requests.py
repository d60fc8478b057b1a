"""What the API does with request values at the edges of what its document says: the NUL
character and numbers that are not finite (which PostgreSQL cannot store: 400, never 500),
strings taken as they were sent (not trimmed, not made from numbers)."""

from __future__ import annotations

import json

import pytest

from approvals.models import Question
from jobs.models import Job

pytestmark = pytest.mark.django_db


def post(api, path: str, raw: str):
    return api.post(path, raw, content_type="application/json")


@pytest.mark.parametrize(
    "raw, field",
    [
        ('{"kind": "demo.review", "input": {"document": "a\\u0000b"}}', "input"),
        ('{"kind": "test.refuse", "input": {"a\\u0000": 1}}', "input"),
        ('{"kind": "test.refuse", "input": {"deep": [{"x": ["\\u0000"]}]}}', "input"),
        ('{"kind": "test.refuse", "input": {"n": 1e400}}', "input"),
        ('{"kind": "demo.noop", "idempotency_key": "k\\u0000"}', "idempotency_key"),
    ],
)
def test_what_the_database_cannot_store_is_a_400_naming_the_field(api, dispatched, raw, field):
    response = post(api, "/api/jobs/", raw)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert not Job.objects.exists()


@pytest.mark.parametrize("answer", ['{"approved": true, "reason": "\\u0000"}', '{"\\u0000": 1}', "-1e999"])
def test_an_answer_the_database_cannot_store_is_a_400(api, paused_review, answer):
    _, question = paused_review
    response = post(api, f"/api/questions/{question.pk}/answer/", f'{{"answer": {answer}}}')
    assert response.status_code == 400 and response.json()["field"] == "answer", response.content
    assert Question.objects.get(pk=question.pk).status == "open"


def test_a_comment_with_nul_is_a_400(api, paused_review):
    _, question = paused_review
    raw = '{"answer": {"approved": true}, "comment": "\\u0000"}'
    response = post(api, f"/api/questions/{question.pk}/answer/", raw)
    assert response.status_code == 400 and response.json()["field"] == "comment"


def test_strings_are_taken_as_sent(api, dispatched):
    response = post(api, "/api/jobs/", json.dumps({"kind": "demo.noop", "idempotency_key": " key "}))
    assert response.status_code == 201 and response.json()["idempotency_key"] == " key "
    # A key of 200 characters, the last a space, is 200 characters long: accepted as it is.
    response = post(api, "/api/jobs/", json.dumps({"kind": "demo.noop", "idempotency_key": "k" * 199 + " "}))
    assert response.status_code == 201
    # One longer is too long, even though it would fit once trimmed.
    response = post(api, "/api/jobs/", json.dumps({"kind": "demo.noop", "idempotency_key": " " + "k" * 200}))
    assert response.status_code == 400 and response.json()["field"] == "idempotency_key"


@pytest.mark.parametrize("body", [{"kind": "demo.noop", "idempotency_key": 12}, {"kind": 7}, {"kind": True}])
def test_a_number_is_not_a_string(api, dispatched, body):
    response = post(api, "/api/jobs/", json.dumps(body))
    assert response.status_code == 400, response.content
    assert not Job.objects.exists()


def test_a_comment_must_be_a_string(api, paused_review):
    _, question = paused_review
    response = post(api, f"/api/questions/{question.pk}/answer/", '{"answer": {"approved": true}, "comment": 5}')
    assert response.status_code == 400 and response.json()["field"] == "comment"
