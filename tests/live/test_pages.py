"""The job pages and their answer forms (the admin's typed forms, `approvals.forms`), through
Django's test client."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import Decision, Question
from approvals.schemas import approval, choice, form, multiple_choice, text
from jobs.models import Job, JobEvent
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.approvals.conftest import paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
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
    answer_url = reverse("approvals:question-answer", args=[job.pk, question.pk])
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
    assert "You may not answer this question: user &#x27;submitter&#x27; may not answer questions" in page
    response = client.post(reverse("approvals:question-answer", args=[job.pk, question.pk]), {"_approve": "1"},
                           follow=True)
    assert "may not answer questions" in response.content.decode()
    assert Question.objects.get(pk=question.pk).status == "open"


def answer_url(job, question) -> str:
    return reverse("approvals:question-answer", args=[job.pk, question.pk])


def question_block(page: str, question) -> str:
    """The HTML of one question's block on the page (up to the next question or the panel's end)."""
    start = page.index(f'data-question-id="{question.pk}"')
    return page[start:page.index("</form>", start)] if "</form>" in page[start:] else page[start:]


def test_a_choice_is_answered_with_radio_buttons_and_recorded_on_the_web_channel(client, reviewer, submitter):
    job, question = paused_on({"prompt": "Which budget?", "schema": choice({"travel": "Travel", "other": "Other"}),
                                "details": {"employee": "Dana", "amount": "120.00 EUR"}}, owner=submitter)
    client.force_login(reviewer)
    page = client.get(detail_url(job)).content.decode()
    block = question_block(page, question)
    # The admin's typed form: radio buttons with the labels, no JSON; details as a list, not JSON.
    assert block.count('type="radio" name="choice"') == 2 and " Travel</label>" in block and " Other</label>" in block
    assert "answer_json" not in page and 'name="_answer"' in block and 'name="csrfmiddlewaretoken"' in block
    assert "<dt>employee</dt><dd>Dana</dd>" in block and "single choice of: Travel, Other" in block
    # Nothing chosen: the page comes back (400) with the error next to the radio buttons.
    response = client.post(answer_url(job, question), {"_answer": "1", "next": detail_url(job)})
    assert response.status_code == 400
    block = question_block(response.content.decode(), question)
    assert 'class="field field-choice has-errors"' in block and "This field is required." in block
    assert Question.objects.get(pk=question.pk).status == "open"
    # A choice, and the job resumes; the ledger says who, and that it came from the job page.
    response = client.post(answer_url(job, question), {"choice": '"travel"', "comment": "per policy",
                                                       "next": detail_url(job)})
    assert response.status_code == 302 and response["Location"] == detail_url(job)
    question.refresh_from_db()
    assert question.status == "answered" and question.answer == "travel" and question.comment == "per policy"
    decision = Decision.objects.get(question=question)
    assert (decision.kind, decision.channel, decision.actor, decision.answer) == ("answered", "web", reviewer, "travel")
    assert Job.objects.get(pk=job.pk).status == "pending"
    assert "Answer recorded" in client.get(detail_url(job)).content.decode()


def test_the_schema_errors_the_service_finds_show_next_to_their_field(client, reviewer, submitter):
    # exclusiveMinimum is not a Django field bound: only the service's schema check refuses 0.
    schema = form({"type": "object", "properties": {
        "amount": {"type": "number", "exclusiveMinimum": 0, "title": "Amount on the receipt"},
        "receipt": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 50},
    }, "required": ["amount"]})
    job, question = paused_on({"schema": schema}, owner=submitter)
    client.force_login(reviewer)
    block = question_block(client.get(detail_url(job)).content.decode(), question)
    assert 'type="number" name="p_amount"' in block and 'type="checkbox" name="p_receipt"' in block
    assert 'name="p_note"' in block and "Amount on the receipt" in block
    response = client.post(answer_url(job, question), {"p_amount": "0", "p_note": "kept"})
    assert response.status_code == 400
    page = response.content.decode()
    block = question_block(page, question)
    assert 'class="field field-p_amount has-errors"' in block
    assert "0 is less than or equal to the minimum of 0" in block
    assert "kept" in block and 'data-touched="1"' in block  # what was typed stays
    assert 'class="field field-p_note"' in block  # other fields carry no error
    assert Question.objects.get(pk=question.pk).status == "open" and not Decision.objects.filter(question=question)
    client.post(answer_url(job, question), {"p_amount": "12.5", "p_receipt": "on"})
    question.refresh_from_db()
    assert question.answer == {"amount": 12.5, "receipt": True}
    assert Decision.objects.get(question=question).channel == "web"


def test_multiple_choice_and_text_use_their_own_fields(client, reviewer, submitter):
    tags, tags_question = paused_on({"schema": multiple_choice(["urgent", "legal", "vip"], min_items=1, max_items=2)},
                                    owner=submitter)
    note, note_question = paused_on({"schema": text(max_length=20)}, owner=submitter)
    client.force_login(reviewer)
    assert question_block(client.get(detail_url(tags)).content.decode(), tags_question).count(
        'type="checkbox" name="choices"') == 3
    # Three is one too many: the schema's maxItems, reported by the service, under the checkboxes.
    response = client.post(answer_url(tags, tags_question), {"choices": ['"urgent"', '"legal"', '"vip"']})
    assert response.status_code == 400
    assert "is too long" in question_block(response.content.decode(), tags_question)
    client.post(answer_url(tags, tags_question), {"choices": ['"urgent"', '"vip"']})
    assert Question.objects.get(pk=tags_question.pk).answer == ["urgent", "vip"]

    assert '<textarea name="text"' in question_block(client.get(detail_url(note)).content.decode(), note_question)
    response = client.post(answer_url(note, note_question), {"text": "x" * 21})
    assert response.status_code == 400 and "at most 20 characters" in response.content.decode()
    client.post(answer_url(note, note_question), {"text": "all good"})
    assert Question.objects.get(pk=note_question.pk).answer == "all good"


def test_a_nested_schema_is_still_answered_as_json(client, reviewer, submitter):
    schema = {"type": "object", "properties": {"lines": {"type": "array", "items": {"type": "object"}}},
              "required": ["lines"]}
    job, question = paused_on({"schema": schema}, owner=submitter)
    client.force_login(reviewer)
    page = client.get(detail_url(job)).content.decode()
    assert 'name="answer_json"' in page and "answer schema" in page
    response = client.post(answer_url(job, question), {"answer_json": "{nope"})
    assert response.status_code == 400 and "not valid JSON" in question_block(response.content.decode(), question)
    response = client.post(answer_url(job, question), {"answer_json": '{"lines": 3}'})
    assert response.status_code == 400 and "is not of type" in question_block(response.content.decode(), question)
    client.post(answer_url(job, question), {"answer_json": '{"lines": [{"sku": 1}]}', "comment": "counted"})
    question.refresh_from_db()
    assert question.answer == {"lines": [{"sku": 1}]} and question.comment == "counted"


def test_a_reviewer_not_assigned_sees_why_not_and_no_form(client, submitter):
    make_user("alice", reviewer=True)
    job, question = paused_on({"schema": choice(["a", "b"]), "assignees": ["alice"]}, owner=submitter)
    client.force_login(make_user("rita", reviewer=True))  # a reviewer, but not one of the assignees
    page = client.get(detail_url(job)).content.decode()
    assert "Question: A question?" in page and 'name="choice"' not in page
    assert "this question is assigned to alice; &#x27;rita&#x27; is not one of them" in page
    response = client.post(answer_url(job, question), {"choice": '"a"'}, follow=True)
    assert "The answer was not recorded" in response.content.decode() and "not one of them" in response.content.decode()
    # An invalid answer from someone who may not answer: told why, not shown a form they cannot use.
    response = client.post(answer_url(job, question), {}, follow=True)
    assert "not one of them" in response.content.decode() and 'name="choice"' not in response.content.decode()
    assert Question.objects.get(pk=question.pk).status == "open"


def test_a_quorum_vote_on_the_page_waits_for_the_next_reviewer(client, submitter):
    job, question = paused_on({"schema": approval(), "required_approvals": 2}, owner=submitter)
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    client.force_login(ann)
    response = client.post(answer_url(job, question), {"_approve": "1", "next": detail_url(job)}, follow=True)
    page = response.content.decode()
    assert "Your approval is recorded (1 of 2)" in page and "yours included" in page
    client.force_login(bob)
    assert "1 of 2" in client.get(detail_url(job)).content.decode()
    # A rejection without a reason is refused by the form, next to the reason.
    response = client.post(answer_url(job, question), {"_reject": "1"})
    assert response.status_code == 400
    assert "give a reason to reject" in question_block(response.content.decode(), question)
    client.post(answer_url(job, question), {"_approve": "1"})
    question.refresh_from_db()
    assert question.status == "answered" and question.approvers() == ["ann", "bob"]
    assert list(Decision.objects.filter(question=question).values_list("channel", flat=True)) == ["web", "web"]


def test_the_answer_form_needs_its_csrf_token(reviewer, submitter):
    job, question = paused_on({"schema": choice(["a", "b"])}, owner=submitter)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(reviewer)
    page = browser.get(detail_url(job)).content.decode()
    assert browser.post(answer_url(job, question), {"choice": '"a"'}).status_code == 403
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert browser.post(answer_url(job, question), {"choice": '"a"', "csrfmiddlewaretoken": token}).status_code == 302
    assert Question.objects.get(pk=question.pk).answer == "a"


def test_the_panel_and_an_unsafe_next_url(client, reviewer, paused_review):
    job, question = paused_review
    client.force_login(reviewer)
    panel = client.get(reverse("jobs:job-panel", args=[job.pk]), {"next": "https://evil.example/"}).content.decode()
    assert 'name="next" value="/jobs/' in panel and "evil" not in panel
    # The panel the script fetches on a question event carries the same typed form.
    assert 'name="_approve"' in panel and 'name="reason"' in panel and 'name="csrfmiddlewaretoken"' in panel
    response = client.post(reverse("approvals:question-answer", args=[job.pk, question.pk]),
                           {"_approve": "1", "next": "https://evil.example/"})
    assert response["Location"] == detail_url(job)


def test_the_admin_job_page_shows_the_live_progress(client, superuser, paused_review):
    job, _ = paused_review
    client.force_login(superuser)
    page = client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    assert f'data-live-job="{job.pk}"' in page and "jobs/live.js" in page and 'id="job-progress"' in page
    assert 'name="_approve"' in page  # a superuser may answer from there too


def test_the_admin_job_page_shows_the_typed_form_and_answers_on_the_web_channel(client, superuser, submitter):
    job, question = paused_on({"schema": choice({"travel": "Travel", "other": "Other"})}, owner=submitter)
    client.force_login(superuser)
    admin_page = reverse("admin:jobs_job_change", args=[job.pk])
    page = client.get(admin_page).content.decode()
    assert 'type="radio" name="choice"' in page and f'name="next" value="{admin_page}"' in page
    response = client.post(answer_url(job, question), {"choice": '"other"', "next": admin_page})
    assert response.status_code == 302 and response["Location"] == admin_page
    assert Decision.objects.get(question=question).channel == "web"
