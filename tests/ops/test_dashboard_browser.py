"""The dashboard in a real browser: Playwright driving Debian's Chromium against uvicorn. The test
does not stop at "the page loaded": it reads the pixels each chart drew, looks for the colours of
the series it made rows for (and not for one it did not), takes a screenshot of the page (kept
under the test's tmp path) and decodes it to find those colours on screen, and watches the page
refresh itself from `/ops/data/`. Skipped, saying why, where Chromium or Playwright is missing.

This process plays the worker (`job_execute`), so every job is run exactly once, here: Celery
messages are not sent, or a worker left running by another test could take these jobs (it does
not know the test's own `ops.park` kind).
"""

from __future__ import annotations

import shutil
import struct
import zlib
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

import jobs.services
from approvals.models import Question
from approvals.services import question_answer
from jobs.models import Job, JobEvent
from jobs.registry import JobKind, _kinds
from jobs.runner import job_execute
from jobs.services import job_submit
from ops.dashboard import CHART_COLORS
from tests.conftest import make_user
from tests.live.conftest import asgi_server, wait_until_serving
from waits.models import Wait
from waits.policy import CheckResult

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium); browser tests skipped",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev.txt)")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000
CHARTS = ("chart-jobs", "chart-durations", "chart-backlog", "chart-question-ages", "chart-waits", "chart-wait-ages")


def rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


TARGETS = {name: rgb(CHART_COLORS[name]) for name in ("completed", "failed", "cancelled", "pending", "processing",
                                                        "questions", "questions_opened", "waiting")}
# For each canvas, the colours of a series with rows behind it, which must show in its pixels.
EXPECTED = {
    "chart-jobs": ("completed", "failed", "pending", "processing"),
    "chart-durations": ("completed", "failed"),
    "chart-backlog": ("questions_opened",),
    "chart-question-ages": ("questions",),
    "chart-waits": ("waiting",),
    "chart-wait-ages": ("waiting",),
}

# Counts the pixels a canvas drew, and those of each target colour (within 2 per channel, opaque).
CANVAS_PIXELS = """([ids, targets]) => ids.map((id) => {
  const canvas = document.getElementById(id);
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const found = Object.fromEntries(Object.keys(targets).map((name) => [name, 0]));
  let drawn = 0;
  for (let i = 0; i < pixels.length; i += 4) {
    if (pixels[i + 3] === 0) continue;
    drawn += 1;
    if (pixels[i + 3] < 250) continue;
    for (const [name, [r, g, b]] of Object.entries(targets)) {
      if (Math.abs(pixels[i] - r) <= 2 && Math.abs(pixels[i + 1] - g) <= 2 && Math.abs(pixels[i + 2] - b) <= 2) {
        found[name] += 1;
      }
    }
  }
  return {id, width: canvas.width, height: canvas.height, drawn, found};
})"""


@pytest.fixture(scope="module")
def dashboard_server(django_db_setup, django_db_blocker):
    """uvicorn serving the platform on the test database."""
    server = asgi_server().start()
    wait_until_serving(server.url)
    yield server.url
    server.stop()


@pytest.fixture
def page(monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()
            connections.close_all()


@pytest.fixture
def this_process_runs_the_jobs(monkeypatch):
    """No Celery message for these jobs (see the module's docstring); `ops.park` registered here."""
    monkeypatch.setattr(jobs.services.transitions, "job_dispatch", lambda **kwargs: None)

    def park(ctx, input):
        return ctx.wait_for("render", submit=lambda token, callback_url: "render-1",
                            check=lambda external_id: CheckResult.pending(), service="renderer")

    monkeypatch.setitem(_kinds, "ops.park", JobKind(name="ops.park", handler=park))


def run(kind: str, input: dict | None = None, *, minutes_ago: float = 0, seconds: float | None = None) -> Job:
    """Submit and run a job; move its events `minutes_ago` back and make its run last `seconds`."""
    job, _ = job_submit(kind=kind, input=input or {})
    job_execute(job_id=job.pk)
    job = Job.objects.get(pk=job.pk)
    if minutes_ago:
        JobEvent.objects.filter(job=job).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    if seconds is not None:
        Job.objects.filter(pk=job.pk).update(started_at=job.finished_at - timedelta(seconds=seconds))
    return job


def png_pixels(data: bytes) -> tuple[int, int, Counter]:
    """Width, height and a count of each RGB colour of an 8-bit, non-interlaced RGB or RGBA PNG
    (what Chromium writes): enough of a decoder to inspect a screenshot without a dependency."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, compressed = 8, bytearray()
    while position < len(data):
        (length,), kind = struct.unpack(">I", data[position:position + 4]), data[position + 4:position + 8]
        body = data[position + 8:position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed += body
    assert depth == 8 and color_type in (2, 6) and interlace == 0, (depth, color_type, interlace)
    channels = 4 if color_type == 6 else 3
    stride, raw = width * channels, zlib.decompress(bytes(compressed))
    colors: Counter = Counter()
    above = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):  # undo the row's filter (PNG spec, section 9)
            left = row[i - channels] if i >= channels else 0
            up, corner = above[i], above[i - channels] if i >= channels else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                nearest = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                row[i] = (row[i] + nearest) & 0xFF
        colors.update(zip(row[0::channels], row[1::channels], row[2::channels], strict=True))
        above = row
    return width, height, colors


def near(colors: Counter, target: tuple[int, int, int], tolerance: int = 3) -> int:
    return sum(count for color, count in colors.items()
               if all(abs(a - b) <= tolerance for a, b in zip(color, target, strict=True)))


def test_the_dashboard_draws_every_chart_from_the_rows_and_refreshes(dashboard_server, page, tmp_path,
                                                                    this_process_runs_the_jobs):
    make_user("boss", superuser=True)
    reviewer = make_user("rita", reviewer=True)
    # Jobs over the last hour: completed ones of various lengths, failed ones, one still pending.
    for number, (minutes_ago, seconds) in enumerate([(52, 0.4), (41, 2), (33, 12), (24, 50), (12, 3), (3, 0.7)]):
        run("demo.noop" if number != 4 else "demo.sleep", {} if number != 4 else {"seconds": 0, "steps": 1},
            minutes_ago=minutes_ago, seconds=seconds)
    for minutes_ago, seconds in [(45, 3), (18, 8), (6, 1.5)]:
        run("test.refuse", minutes_ago=minutes_ago, seconds=seconds)
    job_submit(kind="demo.noop", input={})
    # Questions: one answered after 4 minutes, two still open (25 and 7 minutes).
    answered, *still_open = [run("demo.review", {"document": f"report {n}"}) for n in range(3)]
    question = Question.objects.get(job=answered)
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, channel="api")
    now = timezone.now()
    for job, minutes_ago in [(answered, 14), *zip(still_open, (25, 7), strict=True)]:
        Question.objects.filter(job=job).update(opened_at=now - timedelta(minutes=minutes_ago))
        JobEvent.objects.filter(job=job, type="question", status="open").update(
            created_at=now - timedelta(minutes=minutes_ago))
    JobEvent.objects.filter(job=answered, type="question", status="answered").update(
        created_at=now - timedelta(minutes=10))
    assert run_again(answered).status == "completed"
    # A job parked on a service for 3 minutes.
    parked = run("ops.park")
    assert parked.status == "waiting"
    Wait.objects.filter(job=parked).update(created_at=now - timedelta(minutes=3))

    requests, errors, failed_responses = [], [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    # The browser's own look for /favicon.ico (the admin has none) is not the page's doing.
    page.on("response", lambda response: failed_responses.append(f"{response.status} {response.url}")
            if response.status >= 400 and not response.url.endswith("/favicon.ico") else None)
    page.goto(f"{dashboard_server}/admin/login/?next=/ops/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", "boss")
    page.click("input[type=submit]")
    page.wait_for_url(f"{dashboard_server}/ops/")
    page.wait_for_selector("#content-main[data-ready=true]")
    assert page.inner_text("h1") == "Operations dashboard"

    pixels = {entry["id"]: entry for entry in page.evaluate(CANVAS_PIXELS, [list(CHARTS), TARGETS])}
    for chart in CHARTS:
        entry = pixels[chart]
        assert entry["width"] > 300 and entry["height"] > 150, entry
        assert entry["drawn"] > 0.01 * entry["width"] * entry["height"], f"{chart} is (nearly) blank: {entry}"
        for name in EXPECTED[chart]:
            assert entry["found"][name] > 30, f"no {name} ({CHART_COLORS[name]}) drawn in {chart}: {entry['found']}"
    assert pixels["chart-jobs"]["found"]["cancelled"] == 0  # no job was cancelled: the colour check discriminates
    assert pixels["chart-durations"]["found"]["questions"] == 0

    screenshot = tmp_path / "dashboard.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 20_000
    chart_shot = tmp_path / "jobs-chart.png"
    page.locator("#chart-jobs").screenshot(path=str(chart_shot))
    width, height, colors = png_pixels(chart_shot.read_bytes())
    assert width > 1000 and height > 200
    for name in ("completed", "failed", "pending", "processing"):
        assert near(colors, TARGETS[name]) > 30, f"{name} is not visible in the screenshot of the jobs chart"
    assert near(colors, TARGETS["cancelled"]) == 0

    # Plain numbers as tiles, the tables filled.
    assert page.inner_text('[data-tile="completed"] .ops-tile-value') == "7"
    assert page.inner_text('[data-tile="failed"] .ops-tile-value') == "3"
    assert page.inner_text('[data-tile="questions_open"] .ops-tile-value') == "2"
    assert page.inner_text('[data-tile="questions_oldest"] .ops-tile-value') == "25 min"
    assert page.inner_text('[data-tile="waiting"] .ops-tile-value') == "1"
    assert "demo.noop" in page.inner_text("#table-kinds") and "renderer" in page.inner_text("#table-services")

    # The page refreshes itself from /ops/data/: a job failing now shows without a reload.
    run("test.refuse", seconds=1)
    page.wait_for_function(
        "() => document.querySelector('[data-tile=\"failed\"] .ops-tile-value').textContent === '4'", timeout=25_000)
    assert page.evaluate("() => document.querySelector('#content-main').dataset.refreshedAt") is not None

    assert all(url.startswith(dashboard_server) for url in requests), [u for u in requests if
                                                                      not u.startswith(dashboard_server)]
    assert f"{dashboard_server}/static/ops/vendor/chart.js/chart.umd.min.js" in requests
    assert errors == [] and failed_responses == []


def run_again(job: Job) -> Job:
    job_execute(job_id=job.pk)
    return Job.objects.get(pk=job.pk)
