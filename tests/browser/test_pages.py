"""The pages in a real browser: axe-core finds no serious or critical accessibility violation, the
timeline's sentences are the server's whether rendered with the page, pushed live or paged in
("Show earlier events"), and a person submits a job from `/jobs/`."""

from __future__ import annotations

import pytest

from approvals.models import Question
from approvals.services import question_answer
from jobs.models import Job
from tests.browser.conftest import OUT, axe_violations
from tests.support.processes import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

TIMELINE_JS = "() => Array.from(document.querySelectorAll('#job-timeline li')).map(li => " \
              "[Number(li.dataset.seq), li.querySelector('.text').textContent])"


def server_texts(job: Job) -> dict[int, str]:
    return {event.seq: event.as_dict()["text"] for event in job.events.order_by("seq")}


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_axe_finds_no_serious_violation_on_the_job_page_the_question_page_and_the_inbox(
        open_as, people, review, viewport):
    found = {}
    for name, path in [("job-page", f"/jobs/{review.job_id}/"),
                       ("question-page", f"/admin/approvals/question/{review.pk}/change/"),
                       ("inbox", "/admin/approvals/question/")]:
        page = open_as(people["rita"], path, viewport, bypass_csp=True)  # axe is injected as a script
        page.wait_for_load_state("networkidle")
        violations = axe_violations(page)
        if violations:
            found[name] = violations
        page.context.close()
    assert not found, "\n".join(f"{name}: {v['id']} ({v['impact']}): {node}" for name, vs in found.items()
                                 for v in vs for node in v["nodes"])


def test_live_events_read_as_the_server_words_them(open_as, people, review):
    page = open_as(people["olga"], f"/jobs/{review.job_id}/")
    served_up_to = int(page.get_attribute("#job-live", "data-last-seq"))
    page.wait_for_function("() => document.querySelector('#job-connection').textContent === 'live'")
    question_answer(question_id=review.pk, user=people["rita"], answer={"approved": True, "reason": "reads well"},
                    channel="api")
    page.wait_for_function("() => document.querySelector('#job-status').textContent === 'completed'")
    job = Job.objects.get(pk=review.job_id)
    page.wait_for_function(f"() => document.querySelectorAll('#job-timeline li').length === {job.event_seq}")
    shown = dict(page.evaluate(TIMELINE_JS))
    expected = server_texts(job)
    assert shown == expected
    pushed = {seq: text for seq, text in shown.items() if seq > served_up_to}
    assert "Question “approve” answered by rita: approved: reads well" in pushed.values()
    assert list(pushed.values())[-1] == "Completed"
    page.reload()
    assert dict(page.evaluate(TIMELINE_JS)) == expected  # rendered with the page: the same words


def test_show_earlier_pages_back_through_the_events_api(open_as, people, slept):
    page = open_as(people["boss"], f"/admin/jobs/job/{slept.pk}/change/")
    first = page.evaluate(TIMELINE_JS)
    assert [seq for seq, _ in first] == list(range(slept.event_seq - 49, slept.event_seq + 1))
    page.click("button.show-earlier")
    page.wait_for_function("() => document.querySelector('#job-timeline li').dataset.seq === '1'")
    assert dict(page.evaluate(TIMELINE_JS)) == server_texts(slept)
    assert page.is_hidden("button.show-earlier")
    assert "3 % · step 1 of 30" in server_texts(slept).values()


def test_a_person_submits_a_job_from_the_list_and_follows_it(open_as, people, worker):
    page = open_as(people["olga"], "/jobs/", "phone")
    page.select_option("#submit-kind-choice", "demo.sleep")  # the page shows that kind's fields
    page.wait_for_selector("#job-submit-form input[name=in_steps]")
    # forms.js hides the button once the page is parsed; the fields above may be there before it runs
    page.wait_for_selector(".choose-kind [data-role=choose]", state="hidden", timeout=5000)
    page.fill("#job-submit-form input[name=in_seconds]", "1")
    page.fill("#job-submit-form input[name=in_steps]", "3")
    page.screenshot(path=str(OUT / "submit-phone.png"), full_page=True)
    page.click("#job-submit-form button[type=submit]")
    page.wait_for_url("**/jobs/*-*/")
    job = Job.objects.get(owner=people["olga"], kind="demo.sleep")
    assert job.input == {"seconds": 1, "steps": 3}
    assert "Submitted demo.sleep job" in page.inner_text(".messages")
    page.wait_for_function("() => document.querySelector('#job-status').textContent === 'completed'")
    wait_until(lambda: Job.objects.get(pk=job.pk).status == "completed", timeout=30, message="not completed")
    assert Question.objects.count() == 0
