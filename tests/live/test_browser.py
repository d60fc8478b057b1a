"""A real browser on the job pages: Playwright driving Debian's Chromium against uvicorn and a
real worker. Skipped, saying why, where Chromium or Playwright is missing."""

from __future__ import annotations

import shutil

import pytest
from django.db import connections

from approvals.models import Question
from jobs.models import Job
from jobs.services import job_submit
from tests.conftest import make_user
from tests.support.processes import wait_until

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium); browser tests skipped",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev.txt)")

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000


@pytest.fixture
def page(monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # plain sync code all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()
            # While Playwright's loop runs in this thread, Django keeps the test's connection in
            # a context of its own: close it here, or it holds the test database open.
            connections.close_all()


def sign_in(page, server: str, username: str) -> None:
    page.goto(f"{server}/admin/login/?next=/jobs/")
    page.fill("#id_username", username)
    page.fill("#id_password", username)
    page.click("input[type=submit]")
    page.wait_for_url(f"{server}/jobs/")


def progress(page) -> float:
    return page.eval_on_selector("#job-progress", "bar => bar.value")


def test_the_job_page_shows_the_bar_move_and_the_job_finish(worker, server, page):
    boss = make_user("boss", superuser=True)
    sign_in(page, server, "boss")
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 4, "steps": 8}, owner=boss)
    page.goto(f"{server}/jobs/{job.pk}/")
    page.wait_for_function("() => { const v = document.querySelector('#job-progress').value; return v > 0 && v < 1; }")
    seen = progress(page)
    page.wait_for_function(f"() => document.querySelector('#job-progress').value > {seen}")
    page.wait_for_function("() => document.querySelector('#job-status').textContent === 'completed'")
    assert progress(page) == 1
    page.wait_for_selector("#job-result")
    assert '"slept": 4' in page.inner_text("#job-result")
    job = Job.objects.get(pk=job.pk)
    page.wait_for_function(f"() => document.querySelectorAll('#job-timeline li').length === {job.event_seq}")
    seqs = page.eval_on_selector_all("#job-timeline li", "items => items.map(li => Number(li.dataset.seq))")
    assert seqs == list(range(1, job.event_seq + 1))
    # The list page shows it too.
    page.goto(f"{server}/jobs/")
    assert page.inner_text(f'tr[data-job-id="{job.pk}"] [data-role="status"]') == "completed"


def test_a_reviewer_approves_a_review_on_the_page_and_sees_it_complete(worker, server, page):
    make_user("rita", reviewer=True)
    job, _ = job_submit(kind="demo.review", input={"document": "Contract v3"}, owner=make_user("olga"))
    wait_until(lambda: Question.objects.filter(job=job, status="open").exists(), timeout=30,
               message="the review job did not ask its question")
    sign_in(page, server, "rita")
    page.goto(f"{server}/jobs/{job.pk}/")
    assert page.inner_text("#job-status") == "paused"
    assert "Contract v3" in page.inner_text("#job-panel")
    page.fill("textarea[name=reason]", "reads well")
    page.click("button[name=_approve]")
    page.wait_for_function("() => document.querySelector('#job-status').textContent === 'completed'")
    page.wait_for_selector("#job-result")
    assert '"reviewer": "rita"' in page.inner_text("#job-result")
    assert '"approved": true' in page.inner_text("#job-result")
    question = Question.objects.get(job=job)
    assert question.answer == {"approved": True, "reason": "reads well"} and question.answered_by.username == "rita"
