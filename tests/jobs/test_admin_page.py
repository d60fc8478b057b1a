"""The admin's page of a job reads at a glance: one timeline (the newest events; earlier ones on
request), no empty sections, times to the second with how long ago, long JSON collapsed.
Through Django's test client; the height is measured in a browser (tests/browser)."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from django.urls import reverse

from approvals.services import question_answer
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
    client.force_login(make_user("boss", superuser=True))
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
    # Times to the second, and how long ago; the long checkpoint collapsed.
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((just now|\d+\xa0\w+ ago)\)", page)
    checkpoint = page[page.index("field-checkpoint_display"):]
    assert checkpoint.index('<details class="json-collapsed">') < 400


def test_sections_with_rows_show(client, reviewer):
    job, question = paused_on({"prompt": "Ship it?"})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    page = admin_page(client, job)
    assert page.count('class="js-inline-admin-formset inline-group"') == 1  # the ledger; no waits
    assert "Decisions on its questions" in page and "reviewer" in page
