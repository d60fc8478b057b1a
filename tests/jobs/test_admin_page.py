"""The admin's page of a job reads at a glance: one timeline (the newest events; earlier ones on
request), no empty sections, times to the second with how long ago, long JSON collapsed.
Through Django's test client; the height is measured in a browser (tests/browser)."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from django.urls import reverse

from approvals.services import question_answer
from jobs.admin import STEP_RESULT_PREVIEW, STEPS_SHOWN
from jobs.models import JobStep
from jobs.pages import TIMELINE_LIMIT
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.approvals.conftest import paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_dispatch():
    with mock.patch("jobs.services.transitions.job_dispatch"):
        yield


def admin_page(client, job) -> str:
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.filter(username="boss").first() or make_user("boss", superuser=True))
    return client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()


def test_a_30_step_job_has_one_timeline_of_its_newest_events(client):
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 30})
    assert job_execute(job_id=job.pk) == "completed"
    job.refresh_from_db()
    page = admin_page(client, job)
    assert page.count('<ol class="timeline"') == 1 and "jobevent" not in page.lower()
    seqs = [int(seq) for seq in re.findall(r'<li data-seq="(\d+)"', page)]
    assert seqs == list(range(job.event_seq - TIMELINE_LIMIT + 1, job.event_seq + 1))
    assert 'class="show-earlier"' in page and f'data-events-url="/api/jobs/{job.pk}/events/"' in page
    assert f"{job.event_seq - TIMELINE_LIMIT} earlier not shown" in page
    assert "100 % · step 30 of 30" in page and "&quot;fraction&quot;" not in page  # words, not raw JSON
    # Nothing to show, nothing shown: no ledger, no waits, no "run again after".
    assert "inline-group" not in page and "Decisions on its questions" not in page and "runs again after" not in page
    # Times to the second, and how long ago; the newest steps, the rest on their own list.
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((just now|\d+\xa0\w+ ago)\)", page)
    steps = page[page.index("field-steps_display"):]
    assert re.findall(r"<code>(\d+)</code>", steps)[:STEPS_SHOWN] == [str(n) for n in range(30, 30 - STEPS_SHOWN, -1)]
    assert 'all 30 steps</a>' in steps and f"?job__id__exact={job.pk}" in steps


def test_sections_with_rows_show(client, reviewer):
    job, question = paused_on({"prompt": "Ship it?"})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    page = admin_page(client, job)
    assert page.count('class="js-inline-admin-formset inline-group"') == 1  # the ledger; no waits
    assert "Decisions on its questions" in page and "reviewer" in page


def steps_made(job, count: int, size: int) -> None:
    """`count` finished steps of `size` characters each, written as a run writes them."""
    JobStep.objects.bulk_create(JobStep(job=job, name=f"part {n}", result={"text": "x" * size, "n": n}, attempt=1)
                                for n in range(1, count + 1))


def test_a_job_of_many_big_steps_has_a_page_of_the_same_size_and_statements(client):
    """The page showed every step's whole result: a job of a thousand 1 kB steps made a page of
    over a megabyte. Now the newest steps, each result's first characters."""
    small, _ = job_submit(kind="demo.noop", input={})
    big, _ = job_submit(kind="demo.noop", input={})
    steps_made(small, 2, 10)
    steps_made(big, 400, 5_000)  # 2 MB of results
    few = admin_page(client, small)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as small_reads:
        admin_page(client, small)
    admin_page(client, big)  # each page once before: what the request's middleware keeps of a job
    with CaptureQueriesContext(connection) as big_reads:
        many = admin_page(client, big)
    assert len(many) < len(few) + 20 * STEPS_SHOWN * STEP_RESULT_PREVIEW // 10, (len(few), len(many))
    assert len(big_reads) == len(small_reads) + 1  # the count of its steps, past the newest
    assert "x" * (STEP_RESULT_PREVIEW + 1) not in many and "…" in many
    assert "2 finished, the newest first" in few and "all 2 steps" not in few
    assert "400 finished, the newest 10 here" in many and "all 400 steps</a>" in many
    assert re.findall(r"<code>part (\d+)</code>", many) == [str(n) for n in range(400, 400 - STEPS_SHOWN, -1)]


def test_a_jobs_steps_list_pages_through_them_and_a_steps_page_has_its_whole_result(client, monkeypatch):
    from jobs.admin import JobStepAdmin

    monkeypatch.setattr(JobStepAdmin, "list_per_page", 25)
    job, _ = job_submit(kind="demo.noop", input={})
    other, _ = job_submit(kind="demo.noop", input={})
    steps_made(job, 60, 300)
    steps_made(other, 3, 10)
    client.force_login(make_user("boss", superuser=True))
    listing = reverse("admin:jobs_jobstep_changelist")
    first = client.get(listing, {"job__id__exact": str(job.pk)}).content.decode()
    assert f"Finished steps of demo.noop job {str(job.pk)[:8]}" in first
    names = re.findall(r">part (\d+)</a>", first)
    assert names == [str(n) for n in range(60, 35, -1)]  # the newest first, a page of them
    last = client.get(listing, {"job__id__exact": str(job.pk), "p": "3"}).content.decode()
    assert re.findall(r">part (\d+)</a>", last) == [str(n) for n in range(10, 0, -1)]
    found = client.get(listing, {"job__id__exact": str(job.pk), "q": "part 42"}).content.decode()
    assert re.findall(r">part (\d+)</a>", found) == ["42"]
    # The way back from a search keeps the job (Django's own "Show all" is "?", the jobs' list).
    back = re.findall(r'\(<a href="([^"]*)">([^<]*)</a>\)', found)
    assert back == [(f"?job__id__exact={job.pk}", "all of this job's steps")]
    assert client.get(listing + back[0][0]).status_code == 200
    assert 'href="?"' not in first and "all of this job's steps" not in first  # nothing to go back to
    step = JobStep.objects.get(job=job, name="part 7")
    page = client.get(reverse("admin:jobs_jobstep_change", args=[step.pk])).content.decode()
    assert "x" * 300 in page and str(job.pk) in page
    assert "Save" not in page and "Delete" not in page


def test_the_steps_list_is_a_jobs_and_theirs_who_may_view_jobs(client, reviewer):
    job, _ = job_submit(kind="demo.noop", input={})
    steps_made(job, 2, 10)
    listing = reverse("admin:jobs_jobstep_changelist")
    client.force_login(make_user("boss", superuser=True))
    for query in ({}, {"job__id__exact": "not a job"}, {"job__id__exact": "00000000-0000-0000-0000-000000000000"}):
        response = client.get(listing, query)
        assert response.status_code == 302 and response["Location"] == reverse("admin:jobs_job_changelist"), query
    assert "Job steps" not in client.get(reverse("admin:index")).content.decode()
    client.force_login(reviewer)  # views jobs
    assert client.get(listing, {"job__id__exact": str(job.pk)}).status_code == 200
    client.force_login(make_user("clerk", staff=True))  # staff, no view of jobs
    assert client.get(listing, {"job__id__exact": str(job.pk)}).status_code == 403
