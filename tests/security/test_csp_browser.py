"""The Content-Security-Policy holds on every page people use, and the pages still work under it:
Chromium (Playwright) loads the job list and a job's page (live over the websocket, with the
answer form), the admin's inbox question page and job page, the ops dashboard and the API docs,
and reports every violation of the policy. Skipped, saying why, where Chromium is missing."""

from __future__ import annotations

import shutil

import pytest
from django.db import connections

import jobs.services
from approvals.models import Question
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium); browser tests skipped",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev.txt)")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Recorded by the page itself: every `securitypolicyviolation` event, before any of its scripts run.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  const where = `${e.sourceFile}:${e.lineNumber}`;
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${where}`);
});
"""


@pytest.fixture
def page(monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.set_default_timeout(30_000)
            page.add_init_script(RECORD_VIOLATIONS)
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            page.console_lines = console
            yield page
        finally:
            browser.close()
            connections.close_all()


def visit(page, url: str) -> None:
    response = page.goto(url)
    assert response.status == 200, (url, response.status)
    policy = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy, (url, policy)


def violations(page) -> list[str]:
    found = list(page.evaluate("() => window.__cspViolations"))
    found += [line for line in page.console_lines if "Content Security Policy" in line]
    return found


def test_the_pages_work_under_the_content_security_policy(server, page, monkeypatch):
    monkeypatch.setattr(jobs.services.transitions, "job_dispatch", lambda **kwargs: None)  # this process runs the job
    make_user("boss", superuser=True)
    job, _ = job_submit(kind="demo.review", input={"document": "Q3 report"})
    job_execute(job_id=job.pk)
    assert Job.objects.get(pk=job.pk).status == Job.Status.PAUSED
    question = Question.objects.get(job=job)

    visit(page, f"{server}/admin/login/?next=/jobs/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", "boss")
    page.click("input[type=submit]")
    page.wait_for_url(f"{server}/jobs/")
    page.wait_for_function("() => document.getElementById('feed-connection').textContent === 'live'")
    assert violations(page) == []

    visit(page, f"{server}/jobs/{job.pk}/")
    page.wait_for_function("() => document.getElementById('job-connection').textContent === 'live'")
    assert page.locator("form.answer button.approve").count() == 1  # the answer form, for the superuser
    assert violations(page) == []

    visit(page, f"{server}/admin/approvals/question/{question.pk}/change/")
    assert page.locator("#answer-form").count() == 1
    visit(page, f"{server}/admin/approvals/question/")
    visit(page, f"{server}/admin/jobs/job/{job.pk}/change/")
    page.wait_for_function("() => document.getElementById('job-connection').textContent === 'live'")
    visit(page, f"{server}/admin/")
    assert violations(page) == []

    visit(page, f"{server}/ops/")
    page.wait_for_function("() => document.querySelectorAll('canvas').length > 0 && window.Chart !== undefined")
    assert violations(page) == []

    visit(page, f"{server}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "taskplatform API" in page.inner_text(".swagger-ui .info .title")
    assert violations(page) == []

    # The job still works end to end from its page: approve, and watch it complete live.
    visit(page, f"{server}/jobs/{job.pk}/")
    page.wait_for_function("() => document.getElementById('job-connection').textContent === 'live'")
    page.click("form.answer button.approve")
    page.wait_for_url(f"{server}/jobs/{job.pk}/")
    # Resumed (the server dispatches it: a worker that an earlier test left running may run it at once).
    assert Job.objects.get(pk=job.pk).status in (Job.Status.PENDING, Job.Status.PROCESSING, Job.Status.COMPLETED)
    assert violations(page) == []
