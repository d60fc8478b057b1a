"""Every page at a desktop's width (1,280 px) and a phone's (390 px): nothing scrolls sideways,
and the page's main action (Approve on a question, Submit on the jobs list) lies fully inside the
window. The admin's page of a 30-step job fits in 4,000 px."""

from __future__ import annotations

import pytest

from approvals.models import Question
from jobs.models import Job
from tests.browser.conftest import OUT, geometry, record

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ADMIN_JOB_PAGE_MAX_HEIGHT = 4000


def pages(review: Question, slept: Job) -> list[tuple[str, str, str, str | None]]:
    """(name, who, path, the main action's selector) of every page."""
    return [
        ("jobs-list", "boss", "/jobs/", "#job-submit-form button[type=submit]"),
        ("job-page", "rita", f"/jobs/{review.job_id}/", "button[name=_approve]"),
        ("question-page", "rita", f"/admin/approvals/question/{review.pk}/change/", "[name=_approve]"),
        ("inbox", "rita", "/admin/approvals/question/", None),
        ("admin-job", "boss", f"/admin/jobs/job/{slept.pk}/change/", None),
        ("admin-job-steps", "boss", f"/admin/jobs/jobstep/?job__id__exact={slept.pk}", None),
    ]


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_no_page_scrolls_sideways_and_the_main_action_is_in_the_window(open_as, people, review, slept, viewport):
    failures = []
    for name, who, path, action in pages(review, slept):
        page = open_as(people[who], path, viewport)
        page.wait_for_load_state("networkidle")
        figures = geometry(page, action)
        record(f"{name}@{viewport}", figures)
        page.screenshot(path=str(OUT / f"{name}-{viewport}.png"), full_page=True)
        if figures["scroll_width"] > figures["window_width"]:
            failures.append(f"{name}: the page is {figures['scroll_width']} px wide in a "
                            f"{figures['window_width']} px window")
        if action is not None:
            box = figures["action"]
            if box is None:
                failures.append(f"{name}: no {action} on the page")
            elif box["left"] < 0 or box["right"] > figures["window_width"]:
                failures.append(f"{name}: {action} spans {box['left']}..{box['right']} px in a "
                                f"{figures['window_width']} px window")
        page.context.close()
    assert not failures, "\n".join(failures)


def test_the_admin_page_of_a_30_step_job_fits_in_4000_px(open_as, people, slept):
    assert slept.event_seq >= 60, f"the job wrote only {slept.event_seq} events"
    page = open_as(people["boss"], f"/admin/jobs/job/{slept.pk}/change/", "desktop")
    page.wait_for_load_state("networkidle")
    figures = geometry(page)
    record("admin-job-height@desktop", {**figures, "events": slept.event_seq})
    assert figures["height"] <= ADMIN_JOB_PAGE_MAX_HEIGHT, (
        f"the admin page of a {slept.event_seq}-event job is {figures['height']} px tall")
