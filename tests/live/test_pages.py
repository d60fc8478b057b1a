"""The job pages and their answer form, through Django's test client."""

from __future__ import annotations

from unittest import mock

import pytest
from django.urls import reverse

from approvals.models import Question
from jobs.models import Job, JobEvent
from jobs.runner import job_execute
from jobs.services import job_claim, job_pause, job_submit
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.job_dispatch"):
        yield


@pytest.fixture
def paused_review(submitter):
    job, _ = job_submit(kind="demo.review", input={"document": "The quarterly report"}, owner=submitter)
    assert job_execute(job_id=job.pk) == "paused"
    return job, Question.objects.get(job=job)


def detail_url(job) -> str:
    return reverse("jobs:job-detail", args=[job.pk])


def test_pages_need_a_login_and_send_to_the_admin_login(client):
    job, _ = job_submit(kind="demo.noop", input={})
    for url in (reverse("jobs:job-list"), detail_url(job)):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/?next=")


def test_the_list_shows_only_visible_jobs_and_follows_the_feed(client, submitter):
    mine, _ = job_submit(kind="demo.noop", input={}, owner=submitter)
    theirs, _ = job_submit(kind="demo.noop", input={}, owner=make_user("sam"))
    client.force_login(submitter)
    page = client.get(reverse("jobs:job-list")).content.decode()
    assert f'data-job-id="{mine.pk}"' in page and str(theirs.pk) not in page
    assert 'data-live-feed="/ws/jobs/"' in page and "jobs/live.js" in page


def test_the_job_page_shows_progress_timeline_and_result(client, submitter):
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 2}, owner=submitter)
    assert job_execute(job_id=job.pk) == "completed"
    job.refresh_from_db()
    client.force_login(submitter)
    page = client.get(detail_url(job)).content.decode()
    assert f'data-live-job="{job.pk}"' in page and f'data-last-seq="{job.event_seq}"' in page
    assert 'id="job-progress"' in page and 'value="1.000000"' in page
    assert page.count('<li data-seq="') == job.event_seq
    assert 'id="job-result"' in page and "step_runs" in page
    client.force_login(make_user("stranger"))
    assert client.get(detail_url(job)).status_code == 404


def test_a_reviewer_approves_on_the_page_through_the_service(client, reviewer, paused_review):
    job, question = paused_review
    client.force_login(reviewer)
    page = client.get(detail_url(job)).content.decode()
    assert "The quarterly report" in page
    assert 'name="_approve"' in page and 'name="_reject"' in page and 'name="reason"' in page
    answer_url = reverse("jobs:question-answer", args=[job.pk, question.pk])
    response = client.post(answer_url, {"_approve": "1", "reason": "fine", "next": detail_url(job)})
    assert response.status_code == 302 and response["Location"] == detail_url(job)
    question.refresh_from_db()
    assert question.status == "answered" and question.answer == {"approved": True, "reason": "fine"}
    assert question.answered_by == reviewer
    answered = JobEvent.objects.get(job=job, type="question", status="answered")
    assert answered.message["channel"] == "web" and answered.message["by"] == "reviewer"
    assert Job.objects.get(pk=job.pk).status == "pending"
    # A second answer is refused with a message, not an error page.
    response = client.post(answer_url, {"_reject": "1"}, follow=True)
    assert "already answered by reviewer" in response.content.decode()


def test_the_creator_sees_the_question_but_no_form(client, submitter, paused_review):
    job, question = paused_review
    client.force_login(submitter)
    page = client.get(detail_url(job)).content.decode()
    assert "Approve this document?" in page and "Waiting for a reviewer" in page and "_approve" not in page
    response = client.post(reverse("jobs:question-answer", args=[job.pk, question.pk]), {"_approve": "1"}, follow=True)
    assert "may not answer questions" in response.content.decode()
    assert Question.objects.get(pk=question.pk).status == "open"


def test_other_schemas_are_answered_as_json(client, reviewer, submitter):
    job, _ = job_submit(kind="demo.noop", input={}, owner=submitter)
    schema = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
    job_pause(job=job_claim(job_id=job.pk),
              question={"key": "count", "prompt": "How many?", "schema": schema, "details": {}, "digest": "d"})
    question = Question.objects.get(job=job)
    client.force_login(reviewer)
    assert 'name="answer_json"' in client.get(detail_url(job)).content.decode()
    url = reverse("jobs:question-answer", args=[job.pk, question.pk])
    assert "not valid JSON" in client.post(url, {"answer_json": "{nope"}, follow=True).content.decode()
    assert "answer.count" in client.post(url, {"answer_json": '{"count": "x"}'}, follow=True).content.decode()
    client.post(url, {"answer_json": '{"count": 3}', "comment": "counted"})
    question.refresh_from_db()
    assert question.status == "answered" and question.answer == {"count": 3} and question.comment == "counted"


def test_the_panel_and_an_unsafe_next_url(client, reviewer, paused_review):
    job, question = paused_review
    client.force_login(reviewer)
    panel = client.get(reverse("jobs:job-panel", args=[job.pk]), {"next": "https://evil.example/"}).content.decode()
    assert 'name="next" value="/jobs/' in panel and "evil" not in panel
    response = client.post(reverse("jobs:question-answer", args=[job.pk, question.pk]),
                           {"_approve": "1", "next": "https://evil.example/"})
    assert response["Location"] == detail_url(job)


def test_the_admin_job_page_shows_the_live_progress(client, superuser, paused_review):
    job, _ = paused_review
    client.force_login(superuser)
    page = client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    assert f'data-live-job="{job.pk}"' in page and "jobs/live.js" in page and 'id="job-progress"' in page
    assert 'name="_approve"' in page  # a superuser may answer from there too
