"""The admin inbox and answer form, through Django's test client posting the real forms."""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from approvals.models import Question
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user
from tests.support.commit import dispatches

pytestmark = pytest.mark.django_db


@pytest.fixture
def paused_review():
    job, _ = job_submit(kind="demo.review", input={"document": "The quarterly report"})
    job_execute(job_id=job.pk)
    return job, Question.objects.get(job=job)


def test_the_inbox_lists_open_questions_first(client, reviewer, paused_review):
    _, open_question = paused_review
    answered_job, _ = job_submit(kind="demo.review", input={"document": "old"})
    job_execute(job_id=answered_job.pk)
    Question.objects.filter(job=answered_job).update(status="answered", answered_at="2026-01-01T00:00:00Z")
    client.force_login(reviewer)
    response = client.get(reverse("admin:approvals_question_changelist"))
    assert response.status_code == 200
    rows = list(response.context["cl"].result_list)
    assert rows[0].pk == open_question.pk and rows[0].status == "open"


def test_the_question_page_shows_details_and_approve_reject_buttons(client, reviewer, paused_review):
    _, question = paused_review
    client.force_login(reviewer)
    page = client.get(reverse("admin:approvals_question_change", args=[question.pk])).content.decode()
    assert "The quarterly report" in page
    assert 'name="_approve"' in page and 'name="_reject"' in page and 'name="reason"' in page


def test_approving_in_the_admin_answers_through_the_service_and_resumes_the_job(
    client, reviewer, paused_review, django_capture_on_commit_callbacks
):
    job, question = paused_review
    client.force_login(reviewer)
    url = reverse("admin:approvals_question_answer", args=[question.pk])
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(url, {"_approve": "Approve", "reason": "looks right"}, follow=True)
    assert response.status_code == 200
    assert "Answer recorded" in response.content.decode()
    question.refresh_from_db()
    assert question.status == "answered" and question.answer == {"approved": True, "reason": "looks right"}
    assert question.answered_by == reviewer and question.answered_at is not None
    assert Job.objects.get(pk=job.pk).status == "pending" and len(dispatches(callbacks)) == 1


def test_rejecting_twice_in_the_admin_reports_who_answered_first(client, reviewer, paused_review):
    _, question = paused_review
    client.force_login(reviewer)
    url = reverse("admin:approvals_question_answer", args=[question.pk])
    client.post(url, {"_reject": "Reject", "reason": "no"})
    response = client.post(url, {"_approve": "Approve"}, follow=True)
    assert "already answered by reviewer" in response.content.decode()
    question.refresh_from_db()
    assert question.answer == {"approved": False, "reason": "no"}


def test_a_staff_user_without_the_permission_is_refused(client, paused_review):
    _, question = paused_review
    staff = make_user("viewer", staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_question"))
    client.force_login(staff)
    response = client.post(reverse("admin:approvals_question_answer", args=[question.pk]), {"_approve": "1"},
                           follow=True)
    assert "may not answer questions" in response.content.decode()
    assert Question.objects.get(pk=question.pk).status == "open"


def test_submitting_a_job_in_the_admin(client, superuser, django_capture_on_commit_callbacks):
    client.force_login(superuser)
    add = reverse("admin:jobs_job_add")
    assert "demo.review" in client.get(add).content.decode()
    bad = client.post(add, {"kind": "demo.review", "input": '{"doc": 1}'})
    assert "input" in bad.content.decode() and Job.objects.count() == 0
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(add, {"kind": "demo.review", "input": '{"document": "x"}'})
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"/admin/jobs/job/{job.pk}/change/")
    assert job.owner == superuser and job.status == "pending" and len(dispatches(callbacks)) == 1
    page = client.get(response["Location"]).content.decode()
    assert "demo.review" in page and "pending" in page


def test_the_cancel_action_cancels_each_job_and_reports_the_refused(client, superuser):
    pending, _ = job_submit(kind="demo.noop", input={})
    done, _ = job_submit(kind="demo.noop", input={})
    job_execute(job_id=done.pk)
    client.force_login(superuser)
    response = client.post(
        reverse("admin:jobs_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [str(pending.pk), str(done.pk)]},
        follow=True,
    )
    page = response.content.decode()
    assert "Cancelled 1 job(s)." in page and "Refused 1" in page and str(done.pk)[:8] in page
    assert Job.objects.get(pk=pending.pk).status == "cancelled"
    assert Job.objects.get(pk=done.pk).status == "completed"
