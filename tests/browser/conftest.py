"""The pages as a person sees them: Playwright driving Debian's Chromium against uvicorn and a real
worker, at a desktop's and a phone's width. Skipped, saying why, where Chromium or Playwright is
missing; the accessibility scans also need axe-core (`npm ci` in this folder, which `make test`
runs when npm is there)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from approvals.models import Question
from jobs.models import Job
from jobs.services import job_submit
from tests.conftest import make_user
from tests.live.conftest import live_asgi, server, session_cookie  # noqa: F401 (fixtures)
from tests.support.processes import wait_until

HERE = Path(__file__).resolve().parent
AXE = HERE / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000
VIEWPORTS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
# Screenshots and the measured figures, to look at by eye (not committed).
OUT = Path(os.environ.get("BROWSER_SCREENSHOTS") or HERE.parents[1] / "var" / "screenshots")


def pytest_collection_modifyitems(config, items):
    if CHROMIUM is None:
        skip = pytest.mark.skip(reason="chromium is not installed (apt-get install chromium); browser tests skipped")
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            skip = pytest.mark.skip(reason="playwright is not installed (requirements-dev.txt); browser tests skipped")
        else:
            return
    for item in items:
        if item.nodeid.startswith("tests/browser/"):
            item.add_marker(skip)


@pytest.fixture
def browser(monkeypatch) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's ORM calls stay plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
            # While Playwright's loop runs in this thread, Django keeps the test's connection in a
            # context of its own: close it here, or it holds the test database open.
            connections.close_all()


@pytest.fixture
def open_as(browser, server) -> Callable[..., Any]:  # noqa: F811 (server is the fixture imported above)
    """`open_as(user, path, viewport="desktop")`: a page signed in as `user` (by session cookie),
    at `path`, in a window of that size. `bypass_csp` lets the tests inject axe-core's script."""

    def open_page(user: Any, path: str, viewport: str = "desktop", **context_options: Any) -> Any:
        context = browser.new_context(viewport=VIEWPORTS[viewport], **context_options)
        if user is not None:
            name, _, value = session_cookie(user).partition("=")
            context.add_cookies([{"name": name, "value": value, "url": server}])
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{server}{path}")
        return page

    return open_page


# -- what the pages show ---------------------------------------------------------------------------
@pytest.fixture
def people(db):
    return {"boss": make_user("boss", superuser=True), "rita": make_user("rita", reviewer=True),
            "olga": make_user("olga")}


@pytest.fixture
def review(worker, people) -> Question:
    """A paused demo.review job of olga's, its question open for the reviewers."""
    job, _ = job_submit(kind="demo.review", input={"document": "Q3 report: revenue, costs and the outlook for Q4"},
                        owner=people["olga"])
    # And a long question with a deadline, as the inbox lists them.
    long, _ = job_submit(kind="test.ask", owner=people["olga"], input={
        "prompt": "Approve the refund of the duplicated March invoice for ACME Industries, including the late "
                  "fee that was charged twice and the currency conversion difference?",
        "details": {"customer": "ACME Industries", "amount": "1,240.00 EUR"}, "timeout": 7200})
    wait_until(lambda: Question.objects.filter(job__in=[job, long], status="open").count() == 2, timeout=30,
               message="the jobs did not ask their questions")
    return Question.objects.get(job=job)


@pytest.fixture
def slept(worker, people) -> Job:
    """A finished 30-step demo.sleep (some 95 events)."""
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 3, "steps": 30}, owner=people["boss"])
    wait_until(lambda: Job.objects.get(pk=job.pk).status == "completed", timeout=60,
               message="the 30-step demo.sleep did not complete")
    return Job.objects.get(pk=job.pk)


GEOMETRY_JS = """(selector) => {
  const doc = document.documentElement;
  const el = selector ? document.querySelector(selector) : null;
  const box = el ? el.getBoundingClientRect() : null;
  return {
    window_width: window.innerWidth, scroll_width: doc.scrollWidth, height: doc.scrollHeight,
    action: box ? {left: Math.round(box.left), right: Math.round(box.right), top: Math.round(box.top + scrollY),
                   bottom: Math.round(box.bottom + scrollY)} : null,
  };
}"""


def geometry(page: Any, action: str | None = None) -> dict[str, Any]:
    """The page's width against the window's (sideways scrolling), its height, and where the
    element `action` (a CSS selector) sits, in page coordinates."""
    return page.evaluate(GEOMETRY_JS, action)


def record(name: str, figures: dict[str, Any]) -> None:
    """Keep the figures of one page at one size (var/screenshots/figures.json) and print them."""
    path = OUT / "figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    print(name, figures)


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now."""
    if not AXE.exists():
        pytest.skip("axe-core is not installed: run `npm ci` in tests/browser (make test does it when npm is there)")
    page.add_script_tag(path=str(AXE))
    results = page.evaluate("""async () => {
      const result = await axe.run(document, {resultTypes: ["violations"]});
      return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
        nodes: v.nodes.map(n => n.target.join(" ") + " :: " + n.failureSummary)}));
    }""")
    return [violation for violation in results if violation["impact"] in ("serious", "critical")]
