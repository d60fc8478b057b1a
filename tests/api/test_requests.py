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


# -- query strings and ids: only what the document says ----------------------------------------
@pytest.mark.parametrize(
    "value", ["2020-01-01", "20200101T000000Z", "2020-01-01 00:00:00Z", "2020-W01-1", "2020-02-30T00:00:00Z",
              "2020-01-01T00:00:00+24:00", "٢٠٢٠-01-01T00:00:00Z"],
)
def test_a_time_filter_is_rfc_3339_only(api, value):
    response = api.get("/api/jobs/", {"created_after": value})
    assert response.status_code == 400 and response.json()["field"] == "created_after"


@pytest.mark.parametrize(
    "value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59", "2016-12-31T23:59:60Z",
              "2020-01-01t00:00:00.1234567z"],
)
def test_every_rfc_3339_time_is_a_filter(api, dispatched, value):
    assert api.get("/api/jobs/", {"created_after": value}).status_code == 200
    assert api.get("/api/jobs/", {"created_before": value}).status_code == 200


def test_an_instant_before_the_first_is_before_every_job(api, dispatched):
    post(api, "/api/jobs/", '{"kind": "demo.noop"}')
    assert api.get("/api/jobs/", {"created_after": "0001-01-01T00:00:00+01:00"}).json()["count"] == 1
    assert api.get("/api/jobs/", {"created_before": "0001-01-01T00:00:00+01:00"}).json()["count"] == 0
    assert api.get("/api/jobs/", {"created_before": "9999-12-31T23:59:59-23:59"}).json()["count"] == 1


@pytest.mark.parametrize("value", ["1.0", " 1", "+1", "1_0", "١", "0x1"])
def test_integers_in_a_query_are_ascii_digits(api, paused_review, value):
    job, _ = paused_review
    for path, name in (("/api/jobs/", "page"), ("/api/jobs/", "page_size"), (f"/api/jobs/{job.pk}/events/", "after"),
                       (f"/api/jobs/{job.pk}/events/", "limit")):
        response = api.get(path, {name: value})
        assert response.status_code == 400 and response.json()["field"] == name, (name, value)


def test_a_page_far_past_the_last_is_a_404(api):
    assert api.get("/api/jobs/", {"page": "9" * 5000}).status_code == 404
    assert api.get("/api/jobs/", {"page": "0002"}).status_code == 404  # page 2 of one page


@pytest.mark.parametrize("spelling", [str.upper, lambda text: text.replace("-", ""), "{{{}}}".format,
                                      "urn:uuid:{}".format])
def test_an_id_is_a_uuid_in_its_usual_text(api, paused_review, spelling):
    job, question = paused_review
    assert api.get(f"/api/jobs/{job.pk}/").status_code == 200
    expected = 200 if spelling is str.upper else 404  # hex digits in either case are the same UUID
    assert api.get(f"/api/jobs/{spelling(str(job.pk))}/").status_code == expected
    assert api.get(f"/api/questions/{spelling(str(question.pk))}/").status_code == expected
    response = api.get("/api/questions/", {"job": spelling(str(job.pk))})
    assert response.status_code == (200 if expected == 200 else 400)
