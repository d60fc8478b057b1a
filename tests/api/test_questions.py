"""The questions API and the visibility rule, with two users, a reviewer and staff; answering
through the API resumes the job exactly as the admin does."""

from __future__ import annotations

import uuid

import pytest

from approvals.models import Question
from jobs.models import Job, JobEvent
from jobs.services import job_cancel, job_submit
from tests.api.conftest import client_for
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

QUESTION_FIELDS = {
    "id", "job", "key", "prompt", "schema", "details", "status", "answer", "comment", "answered_by", "answered_at",
    "expires_at", "created_at",
    # Added by the reviewers' side (typed questions, assignees, quorum).
    "type", "assignees", "required_approvals", "approvals",
    # Added by the re-check at use (the contract's `round` and `asked_again_because`).
    "round", "asked_again_because", "valid_for",
}


def answer(client, question, body):
    return client.post(f"/api/questions/{question.pk}/answer/", body, format="json")


# -- visibility ----------------------------------------------------------------------------------
def test_the_creator_sees_their_job_and_its_question(api, paused_review):
    job, question = paused_review
    assert api.get(f"/api/jobs/{job.pk}/").status_code == 200
    body = api.get(f"/api/questions/{question.pk}/").json()
    assert set(body) == QUESTION_FIELDS
    assert body["job"] == str(job.pk) and body["key"] == "approve" and body["status"] == "open"
    assert body["details"] == {"document": "Q3 report"} and body["schema"]["required"] == ["approved"]
    assert [q["id"] for q in api.get("/api/questions/").json()["results"]] == [str(question.pk)]


def test_another_user_sees_neither_the_job_nor_its_question(other_api, paused_review):
    job, question = paused_review
    for url in (f"/api/jobs/{job.pk}/", f"/api/jobs/{job.pk}/events/", f"/api/questions/{question.pk}/"):
        response = other_api.get(url)
        assert response.status_code == 404, url
        assert response.json()["code"] == "not_found"
    assert other_api.get("/api/jobs/").json()["count"] == 0
    assert other_api.get("/api/questions/").json()["count"] == 0
    assert answer(other_api, question, {"answer": {"approved": True}}).status_code == 404


def test_a_reviewer_sees_the_job_with_an_open_question_and_the_question(reviewer_api, paused_review, submitter):
    job, question = paused_review
    unrelated, _ = job_submit(kind="demo.noop", owner=submitter)
    assert reviewer_api.get(f"/api/jobs/{job.pk}/").status_code == 200
    assert reviewer_api.get(f"/api/jobs/{job.pk}/events/").status_code == 200
    assert reviewer_api.get(f"/api/questions/{question.pk}/").status_code == 200
    assert reviewer_api.get(f"/api/jobs/{unrelated.pk}/").status_code == 404
    listed = {job_["id"] for job_ in reviewer_api.get("/api/jobs/").json()["results"]}
    assert listed == {str(job.pk)}
    assert reviewer_api.get("/api/questions/", {"status": "open"}).json()["count"] == 1


def test_staff_see_every_job_and_question(staff_api, paused_review, other):
    job, question = paused_review
    theirs, _ = job_submit(kind="demo.noop", owner=other)
    listed = {job_["id"] for job_ in staff_api.get("/api/jobs/").json()["results"]}
    assert listed == {str(job.pk), str(theirs.pk)}
    assert staff_api.get(f"/api/questions/{question.pk}/").status_code == 200


def test_question_filters(staff_api, paused_review, submitter):
    job, question = paused_review
    second, _ = job_submit(kind="demo.review", input={"document": "other"}, owner=submitter)
    from jobs.runner import job_execute

    job_execute(job_id=second.pk)
    job_cancel(job_id=second.pk)

    def ids(**params):
        return {q["id"] for q in staff_api.get("/api/questions/", params).json()["results"]}

    assert ids(status="open") == {str(question.pk)}
    assert ids(status="cancelled") == {str(Question.objects.get(job=second).pk)}
    assert ids(job=str(job.pk)) == {str(question.pk)}
    assert ids(job=str(uuid.uuid4())) == set()


@pytest.mark.parametrize("params, field", [({"status": "pending"}, "status"), ({"job": "not-a-uuid"}, "job")])
def test_a_bad_question_filter_is_400_naming_it(api, params, field):
    response = api.get("/api/questions/", params)
    assert response.status_code == 400 and response.json()["field"] == field


@pytest.mark.parametrize("question_id", [str(uuid.uuid4()), "nope"])
def test_an_unknown_question_is_404(api, question_id):
    assert api.get(f"/api/questions/{question_id}/").status_code == 404


# -- answering -----------------------------------------------------------------------------------
def test_an_answer_through_the_api_resumes_the_job(
    reviewer_api, paused_review, desk_reviewer, django_capture_on_commit_callbacks, dispatched
):
    job, question = paused_review
    with django_capture_on_commit_callbacks(execute=True):
        response = answer(reviewer_api, question, {"answer": {"approved": True, "reason": "fine"}, "comment": "ok"})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "answered" and body["answered_by"] == "desk" and body["answered_at"]
    assert body["answer"] == {"approved": True, "reason": "fine"} and body["comment"] == "ok"
    assert Job.objects.get(pk=job.pk).status == "pending"
    assert dispatched == [job.pk]
    answered = JobEvent.objects.get(job=job, type="question", status="answered")
    assert answered.message["channel"] == "api" and answered.message["by"] == "desk"


def test_a_second_answer_is_409_naming_who_answered(reviewer_api, paused_review, dispatched):
    _, question = paused_review
    assert answer(reviewer_api, question, {"answer": {"approved": False}}).status_code == 200
    second_reviewer = make_user("second", reviewer=True)
    response = answer(client_for(second_reviewer), question, {"answer": {"approved": True}})
    assert response.status_code == 409
    assert response.json()["code"] == "already_answered" and "already answered by desk" in response.json()["detail"]
    question.refresh_from_db()
    assert question.answer == {"approved": False} and question.answered_by.username == "desk"


@pytest.mark.parametrize(
    "body, field, code",
    [
        ({"answer": {"approved": "yes"}}, "answer.approved", "invalid_answer"),
        ({"answer": {}}, "answer", "invalid_answer"),
        ({"answer": None}, "answer", "invalid_answer"),
        ({"comment": "no answer"}, "answer", "invalid"),
        ({"answer": {"approved": True}, "comment": 5 * [1]}, "comment", "invalid"),
    ],
)
def test_an_answer_that_fails_the_schema_is_400_naming_the_field(reviewer_api, paused_review, body, field, code):
    job, question = paused_review
    response = answer(reviewer_api, question, body)
    assert response.status_code == 400, response.json()
    assert response.json()["field"] == field and response.json()["code"] == code
    question.refresh_from_db()
    assert question.status == "open"
    assert Job.objects.get(pk=job.pk).status == "paused"


def test_the_creator_without_the_answer_permission_gets_403(api, paused_review):
    _, question = paused_review
    response = answer(api, question, {"answer": {"approved": True}})
    assert response.status_code == 403
    assert response.json()["code"] == "not_allowed" and "answer_question" in response.json()["detail"]
    question.refresh_from_db()
    assert question.status == "open"


def test_answering_a_closed_question_is_409(reviewer_api, paused_review):
    job, question = paused_review
    job_cancel(job_id=job.pk)
    response = answer(reviewer_api, question, {"answer": {"approved": True}})
    assert response.status_code == 409 and response.json()["code"] == "question_closed"
