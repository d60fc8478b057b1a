"""The combined wait through the services, the API, the job's page and the admin, with the job
run in this process (`test.combined`: a pretend service that no HTTP reaches): a person provides
the result, retries the submit or fails the wait; the deadline's policies; who may act; the
ledger; and what each loser of a race is told."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job
from jobs.runner import job_execute
from jobs.runtime import JobFailure
from jobs.services import job_cancel, job_submit
from tests.api.conftest import client_for
from tests.approvals import conftest as approvals_fixtures
from tests.approvals.conftest import answer_group, member_of
from tests.conftest import make_user
from tests.waitkinds.kinds import seen, service_finish
from waits.errors import InvalidResult, NotAllowedToAct, WaitBusy, WaitEnded, WakeTokenInvalid
from waits.models import Wait, WaitDecision
from waits.people import person_spec_build, wait_expire, wait_fail, wait_provide, wait_retry_submit
from waits.policy import Person
from waits.services import waits_resume_due, wake_token_redeem

pytestmark = pytest.mark.django_db
kind_options = approvals_fixtures.kind_options
LONG = {"marks": [600, 1200]}


def parked(input: dict | None = None, *, owner=None) -> tuple[Job, Wait]:
    """A `test.combined` job run once in this process: it submitted and parked."""
    job, _ = job_submit(kind="test.combined", input={**LONG, **(input or {})}, owner=owner)
    return run(job), Wait.objects.get(job=job)


def run(job: Job) -> Job:
    job_execute(job_id=job.pk)
    job = Job.objects.get(pk=job.pk)
    return job


def resumes(job: Job) -> int:
    return job.events.filter(type="status", status="pending").count()


def ledger(wait: Wait) -> list[tuple[str, str, str]]:
    return list(WaitDecision.objects.filter(wait=wait).order_by("id").values_list("kind", "channel", "actor_name"))


@pytest.fixture
def ann(db):
    return make_user("ann", reviewer=True)


def test_a_person_provides_the_result_and_the_job_resumes_with_it(ann):
    job, wait = parked()
    assert job.status == "waiting" and wait.has_person and wait.assignee_names() == ["group:reviewers"]
    wait = wait_provide(wait_id=wait.pk, user=ann, result={"text": "written by ann"}, comment="service down",
                        via="api", client_address="10.0.0.9")
    assert (wait.state, wait.ended_by, wait.result) == ("succeeded", "person", {"text": "written by ann"})
    assert Job.objects.get(pk=job.pk).status == "pending" and resumes(job) == 2
    row = WaitDecision.objects.get(wait=wait)
    assert (row.kind, row.channel, row.via, row.actor, row.comment, row.client_address) == (
        "provided", "person", "api", ann, "service down", "10.0.0.9")
    job = run(job)
    assert job.status == "completed" and job.result == {"text": "written by ann", "ended_by": "person"}
    assert seen(job.pk, "checks") == []  # the service was not asked again


def test_a_result_that_breaks_the_schema_is_refused_naming_the_field(ann):
    job, wait = parked()
    with pytest.raises(InvalidResult) as refused:
        wait_provide(wait_id=wait.pk, user=ann, result={"text": ""})
    assert refused.value.field == "result.text" and refused.value.http_status == 400
    assert Wait.objects.get(pk=wait.pk).state == "waiting" and Job.objects.get(pk=job.pk).status == "waiting"
    assert ledger(wait) == []


def test_a_person_retries_the_submit_with_a_new_token(ann):
    job, wait = parked()
    old_token = seen(job.pk, "tokens")[0]
    wait = wait_retry_submit(wait_id=wait.pk, user=ann, comment="the service lost it")
    assert wait.state == "submitting" and wait.external_id == "" and wait.deadline_at is None
    assert Job.objects.get(pk=job.pk).status == "pending"
    job = run(job)
    wait.refresh_from_db()
    tokens = seen(job.pk, "tokens")
    assert job.status == "waiting" and wait.state == "waiting" and wait.external_id == "pretend-2"
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    with pytest.raises(WakeTokenInvalid):  # the lost work's token wakes nothing any more
        wake_token_redeem(token=old_token)
    assert ledger(wait) == [("retried", "person", "ann")]
    wake_token_redeem(token=tokens[1])
    service_finish(job.pk, "second try")
    job = run(job)
    assert job.result == {"text": "second try", "ended_by": "callback"}
    assert ledger(wait)[-1] == ("succeeded", "callback", "system")


def test_a_person_fails_the_wait_and_the_job_fails(ann):
    job, wait = parked()
    with pytest.raises(InvalidResult, match="reason"):
        wait_fail(wait_id=wait.pk, user=ann, reason="  ")
    wait = wait_fail(wait_id=wait.pk, user=ann, reason="the vendor closed the account")
    job = Job.objects.get(pk=job.pk)
    assert job.status == "failed" and job.error["code"] == "failed_by_person"
    assert "ann" in job.error["message"] and "vendor" in job.error["message"]
    assert (wait.state, wait.ended_by) == ("failed", "person") and ledger(wait) == [("failed", "person", "ann")]
    assert resumes(job) == 1


def test_who_may_act_is_the_rule_of_questions(kind_options):
    ops = answer_group("ops")
    olga = member_of(ops, "olga")
    outsider = make_user("outsider", reviewer=True)
    nobody = make_user("nobody")
    job, wait = parked({"person": {"assignees": "group:ops"}}, owner=olga)
    with pytest.raises(NotAllowedToAct, match="assigned to group:ops; 'outsider' is not one of them"):
        wait_provide(wait_id=wait.pk, user=outsider, result={"text": "x"})
    with pytest.raises(NotAllowedToAct, match="answer_question"):
        wait_provide(wait_id=wait.pk, user=nobody, result={"text": "x"})
    with pytest.raises(NotAllowedToAct, match="submitted this job"):
        wait_provide(wait_id=wait.pk, user=olga, result={"text": "x"})
    kind_options("test.combined", allow_self_approval=True)
    wait_provide(wait_id=wait.pk, user=olga, result={"text": "x"})


def test_a_wait_without_a_person_cannot_be_ended_by_one(ann):
    job, _ = job_submit(kind="test.wait", input={"delay": 3600, "marks": [600], "drop_callback": True})
    wait = Wait.objects.create(job=job, key="plain", token_salt="s", token_hash="h" * 64, state="waiting")
    with pytest.raises(NotAllowedToAct, match="no person channel"):
        wait_provide(wait_id=wait.pk, user=ann, result={"text": "x"})


# -- races: what came first wins, the other is told ------------------------------------------
def test_a_person_after_the_callback_is_told_the_callback_came_first(ann):
    job, wait = parked()
    wake_token_redeem(token=seen(job.pk, "tokens")[0])
    with pytest.raises(WaitBusy, match="the service called back first"):
        wait_provide(wait_id=wait.pk, user=ann, result={"text": "mine"})
    assert ledger(wait) == [("refused", "person", "ann")]
    assert resumes(job) == 2
    service_finish(job.pk, "the service's")
    job = run(job)
    assert job.result == {"text": "the service's", "ended_by": "callback"}
    with pytest.raises(WaitEnded, match="too late.*the service called back and its result was collected"):
        wait_provide(wait_id=wait.pk, user=ann, result={"text": "mine"})


def test_a_callback_after_a_person_is_told_a_person_came_first(ann):
    job, wait = parked()
    wait_provide(wait_id=wait.pk, user=ann, result={"text": "mine"})
    with pytest.raises(WakeTokenInvalid, match="already ended: ann provided the result"):
        wake_token_redeem(token=seen(job.pk, "tokens")[0])
    assert resumes(job) == 2


def test_a_second_person_is_told_who_came_first(ann):
    bob = make_user("bob", reviewer=True)
    job, wait = parked()
    wait_fail(wait_id=wait.pk, user=ann, reason="no")
    with pytest.raises(WaitEnded, match="ann failed it"):
        wait_provide(wait_id=wait.pk, user=bob, result={"text": "mine"})


# -- the marks and the one deadline ------------------------------------------------------------
def test_past_the_last_mark_a_combined_wait_waits_for_the_callback_a_person_or_its_deadline(ann):
    job, wait = parked({"marks": [0.2]})
    time.sleep(0.3)
    assert waits_resume_due() == 1
    job = run(job)  # the backup check: still pending
    wait.refresh_from_db()
    assert job.status == "waiting" and wait.next_due_at is None and wait.checks == 1
    assert waits_resume_due() == 0
    wait_provide(wait_id=wait.pk, user=ann, result={"text": "late but fine"})
    assert run(job).status == "completed"


def test_a_backup_check_that_finds_the_result_ends_it_by_check():
    job, wait = parked({"marks": [0.2, 600]})
    service_finish(job.pk)
    time.sleep(0.3)
    waits_resume_due()
    job = run(job)
    assert job.result["ended_by"] == "check" and ledger(wait) == [("succeeded", "check", "system")]


def later(seconds: float = 3600):
    return timezone.now() + timedelta(seconds=seconds)


def test_the_deadline_default_resumes_the_job_with_the_default(ann):
    job, wait = parked({"timeout": 60, "on_timeout": {"action": "default", "answer": {"text": "fallback"}}})
    assert wait.deadline_at is not None
    assert wait_expire(wait_id=wait.pk, now=later(30)) is None  # not due yet
    assert wait_expire(wait_id=wait.pk, now=later()) == "default"
    assert Job.objects.get(pk=job.pk).status == "pending"
    job = run(job)
    assert job.result == {"text": "fallback", "ended_by": "deadline"}
    assert ledger(wait) == [("defaulted", "deadline", "system")]
    with pytest.raises(WaitEnded, match="its deadline passed"):
        wait_provide(wait_id=wait.pk, user=ann, result={"text": "too late"})


def test_the_deadline_fail_and_cancel_policies():
    job, wait = parked({"timeout": 60})  # Fail is the default
    assert wait_expire(wait_id=wait.pk, now=later()) == "fail"
    job = Job.objects.get(pk=job.pk)
    assert job.status == "failed" and job.error["code"] == "deadline_exceeded"
    assert ledger(wait) == [("failed", "deadline", "system")]
    job, wait = parked({"timeout": 60, "on_timeout": {"action": "cancel"}})
    assert wait_expire(wait_id=wait.pk, now=later()) == "cancel"
    assert Job.objects.get(pk=job.pk).status == "cancelled"
    assert ledger(wait) == [("cancelled", "deadline", "system")]


def test_the_deadline_escalates_to_other_people(ann):
    boss = member_of(answer_group("managers"), "boss")
    job, wait = parked({"timeout": 60, "on_timeout": {"action": "escalate", "to": "group:managers", "timeout": 60}})
    assert wait_expire(wait_id=wait.pk, now=later()) == "escalate"
    wait.refresh_from_db()
    assert wait.assignee_names() == ["group:managers"] and wait.deadline_at > timezone.now()
    with pytest.raises(NotAllowedToAct):
        wait_provide(wait_id=wait.pk, user=ann, result={"text": "x"})
    wait_provide(wait_id=wait.pk, user=boss, result={"text": "the boss"})
    assert ledger(wait) == [("escalated", "deadline", "system"), ("provided", "person", "boss")]
    assert job.events.filter(type="wait", status="escalated").exists()


def test_a_cancelled_job_closes_the_wait_in_the_ledger():
    job, wait = parked()
    job_cancel(job_id=job.pk)
    wait.refresh_from_db()
    assert (wait.state, wait.ended_by) == ("cancelled", "system")
    assert ledger(wait) == [("cancelled", "system", "system")]


@pytest.mark.parametrize("person, timeout, on_timeout, match", [
    (None, 60, None, "need person"),
    (Person("p", schema={"type": "nonsense"}), None, None, "not a valid JSON Schema"),
    (Person("", schema={}), None, None, "prompt"),
    (Person("p", schema={}), None, "fail", "on_timeout needs a timeout"),
])
def test_a_mistake_in_the_combined_wait_fails_the_job_as_invalid_wait(person, timeout, on_timeout, match):
    with pytest.raises(JobFailure, match=match) as failure:
        person_spec_build(key="k", person=person, timeout=timeout, on_timeout=on_timeout)
    assert failure.value.code == "invalid_wait"


# -- the API, the job's page, the admin --------------------------------------------------------
def test_the_api_lists_the_wait_and_a_reviewer_provides_the_result(db):
    desk = make_user("desk")  # a reviewer who is not staff: sees the job only through the wait
    desk.groups.add(answer_group("reviewers"))
    job, wait = parked()
    api = client_for(desk)
    assert api.get(f"/api/jobs/{job.pk}/").status_code == 200
    listed = api.get("/api/waits/", {"job": str(job.pk)}).json()["results"]
    assert [item["id"] for item in listed] == [wait.pk]
    body = api.get(f"/api/waits/{wait.pk}/").json()
    assert body["person"]["schema"]["required"] == ["text"] and body["assignees"] == ["group:reviewers"]
    assert body["ended_by"] == "" and body["state"] == "waiting"
    bad = api.post(f"/api/waits/{wait.pk}/provide/", {"result": {"text": 3}}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "result.text"
    response = api.post(f"/api/waits/{wait.pk}/provide/", {"result": {"text": "by api"}}, format="json")
    assert response.status_code == 200 and response.json()["ended_by"] == "person"
    again = api.post(f"/api/waits/{wait.pk}/fail/", {"reason": "x"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "wait_ended"
    assert "desk provided the result" in again.json()["detail"]
    rows = api.get(f"/api/waits/{wait.pk}/decisions/").json()
    assert [(row["kind"], row["channel"], row["via"]) for row in rows] == [
        ("provided", "person", "api"), ("refused", "person", "api")]


def test_the_api_hides_waits_of_jobs_the_caller_may_not_see(db):
    _, wait = parked()
    other = client_for(make_user("other"))
    assert other.get(f"/api/waits/{wait.pk}/").status_code == 404
    assert other.post(f"/api/waits/{wait.pk}/retry/", {}, format="json").status_code == 404
    assert other.get("/api/waits/").json()["count"] == 0


def test_the_job_page_offers_the_three_actions_and_provides_through_the_form(ann):
    job, wait = parked()
    browser = Client()
    browser.force_login(ann)
    page = browser.get(reverse("jobs:job-detail", args=[job.pk])).content.decode()
    assert "Provide this result" in page and "Retry the submit" in page and "Fail the wait" in page
    url = reverse("waits:wait-act", args=[job.pk, wait.pk])
    response = browser.post(url, {"p_text": "", "_provide": "1"})
    assert response.status_code == 400  # the form comes back with its error
    response = browser.post(url, {"p_text": "from the page", "_provide": "1"})
    assert response.status_code == 302
    assert WaitDecision.objects.get(wait=wait, kind="provided").via == "web"
    assert run(job).result == {"text": "from the page", "ended_by": "person"}


def test_the_admin_wait_page_retries_and_fails(ann, superuser):
    job, wait = parked()
    browser = Client()
    browser.force_login(superuser)
    page = browser.get(reverse("admin:waits_wait_change", args=[wait.pk])).content.decode()
    assert "Stand in for the service" in page and "Provide this result" in page
    browser.post(reverse("admin:waits_wait_act", args=[wait.pk]), {"_retry": "1", "reason": "lost"})
    assert ledger(wait) == [("retried", "person", "boss")]
    run(job)
    browser.post(reverse("admin:waits_wait_act", args=[wait.pk]), {"_fail": "1", "reason": "give up"})
    assert Job.objects.get(pk=job.pk).error["code"] == "failed_by_person"
    assert WaitDecision.objects.filter(wait=wait).latest("id").via == "admin"


def test_the_openapi_schema_has_the_waits_operations(client):
    schema = client.get("/api/schema/", {"format": "json"}).json()
    for action in ("provide", "retry", "fail"):
        responses = schema["paths"][f"/api/waits/{{id}}/{action}/"]["post"]["responses"]
        assert {"200", "400", "401", "403", "404", "409", "429"} <= set(responses), action
    assert "get" in schema["paths"]["/api/waits/"] and "get" in schema["paths"]["/api/waits/{id}/decisions/"]
    wait = schema["components"]["schemas"]["Wait"]["properties"]
    assert {"person", "assignees", "deadline_at", "ended_by"} <= set(wait)


def test_demo_generate_asks_a_person_to_stand_in_when_told(db):
    job, _ = job_submit(kind="demo.generate", input={"prompt": "p", "delay": 1, "stand_in": True, "timeout": 60})
    assert job.input["stand_in"] is True  # the flag is part of its input schema


def test_the_readme_shows_the_combined_wait_to_job_authors():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Waiting on external work"):].split("\n## ")[0]
    assert "person=Person(" in section and "timeout=" in section and "on_timeout=" in section
    assert all(channel in section for channel in ("`callback`", "`check`", "`person`", "`deadline`"))
