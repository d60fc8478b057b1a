"""A real browser on the job pages: Playwright driving Debian's Chromium against uvicorn and a
real worker. Skipped, saying why, where Chromium or Playwright is missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.db import connections

from approvals.models import Decision, Question
from approvals.schemas import choice
from approvals.services import question_answer
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
# Where the answer-form cases leave screenshots of the page, to look at by eye.
SCREENSHOTS = Path(os.environ.get("BROWSER_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "var" / "screenshots")


@pytest.fixture
def page(monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # plain sync code all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
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
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
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
    # The page connected with a ticket from POST /api/ws-tickets/ (the session asked for it).
    assert sockets and all("ticket=" in url for url in sockets), sockets
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


def test_a_reviewer_answers_a_choice_with_the_typed_form_and_sees_the_job_complete(worker, server, page):
    make_user("rita", reviewer=True)
    job, _ = job_submit(kind="test.ask", owner=make_user("olga"), input={
        "prompt": "Which budget pays?", "schema": choice({"travel": "Travel", "other": "Other"}),
        "details": {"employee": "Dana", "amount": "120.00 EUR"},
    })
    wait_until(lambda: Question.objects.filter(job=job, status="open").exists(), timeout=30,
               message="the job did not ask its question")
    sign_in(page, server, "rita")
    page.goto(f"{server}/jobs/{job.pk}/")
    assert page.inner_text("#job-status") == "paused"
    block = page.locator("#question-q")
    assert "Dana" in block.inner_text() and "answer_json" not in page.content()
    block.get_by_label("Other").check()
    block.get_by_label("Comment (optional)").fill("no travel budget left")
    page.screenshot(path=str(SCREENSHOTS / "job-page-choice.png"), full_page=True)
    block.locator("button[name=_answer]").click()
    page.wait_for_function("() => document.querySelector('#job-status').textContent === 'completed'")
    page.wait_for_selector("#job-result")
    assert '"answer": "other"' in page.inner_text("#job-result") and '"by": "rita"' in page.inner_text("#job-result")
    assert "Answer recorded" in page.inner_text(".messages")
    decision = Decision.objects.get(question__job=job)
    assert (decision.channel, decision.actor_name, decision.answer, decision.comment) == (
        "web", "rita", "other", "no travel budget left")


def test_an_expense_is_answered_question_after_question_as_each_appears_on_the_page(worker, server, page):
    """demo.expense asks a choice, then a form, then a quorum approval; each form appears on the
    open page when its question event arrives, a schema error shows next to its field, and what
    the reviewer typed survives a refresh of the question block (another reviewer's vote)."""
    make_user("rita", reviewer=True)
    rev2 = make_user("rev2", reviewer=True)
    sign_in(page, server, "rita")
    job, _ = job_submit(kind="demo.expense", owner=make_user("olga"), input={
        "employee": "Dana", "amount": 120, "description": "Train to Lyon", "approvals": 2})
    page.goto(f"{server}/jobs/{job.pk}/")
    page.locator("#question-category").get_by_label("Travel").check()  # waits for the live question block
    page.click("#question-category button[name=_answer]")

    check = page.locator("#question-check")
    check.locator("input[name=p_amount]").fill("0")  # the schema wants more than 0 (exclusiveMinimum)
    check.locator("[name=p_note]").fill("receipt is a photo")
    check.locator("button[name=_answer]").click()
    error = page.locator("#question-check .field-p_amount .errorlist")
    assert "0 is less than or equal to the minimum of 0" in error.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "job-page-form-error.png"), full_page=True)
    assert check.locator("[name=p_note]").input_value() == "receipt is a photo"
    check.locator("input[name=p_amount]").fill("118.5")
    check.locator("input[name=p_receipt_attached]").check()
    check.locator("button[name=_answer]").click()

    approve = page.locator("#question-approve")
    approve.locator("textarea[name=reason]").fill("receipt checked")
    question = Question.objects.get(job=job, key="approve")
    question_answer(question_id=question.pk, user=rev2, answer={"approved": True}, channel="api")
    page.wait_for_function("() => (document.querySelector('#question-approve .approvals') || {}).textContent"
                           " === '1 of 2'")
    assert approve.locator("textarea[name=reason]").input_value() == "receipt checked"
    page.screenshot(path=str(SCREENSHOTS / "job-page-approval.png"), full_page=True)
    approve.locator("button[name=_approve]").click()
    page.wait_for_function("() => document.querySelector('#job-status').textContent === 'completed'")
    page.wait_for_selector("#job-result")
    job = Job.objects.get(pk=job.pk)
    assert job.result["approvers"] == ["rev2", "rita"] and job.result["category"] == "travel"
    assert job.result["paid"] == 118.5
    channels = list(Decision.objects.filter(job=job).order_by("created_at", "id").values_list("channel", flat=True))
    assert channels == ["web", "web", "api", "web"]
