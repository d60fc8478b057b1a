"""Item 8: a job's Python traceback stays in the logs and the admin. The owner sees the error's
code and message (the API, the job's page, its events, the websocket's job object) and so do
webhooks; never the traceback, which names files, lines and code of the platform."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client

from jobs.models import Job, JobEvent
from jobs.presenters import job_as_dict
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_create

pytestmark = pytest.mark.django_db

TRACE_MARKS = ("Traceback", 'File "', "tests/testkinds/kinds.py")


def no_traceback(text: str) -> bool:
    return not any(mark in text for mark in TRACE_MARKS)


@pytest.fixture
def failed_job(settings, caplog):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = True
    owner = make_user("shop")
    webhook_create(owner=owner, url="http://127.0.0.1:9/hook", events=["failed"])
    job, _ = job_submit(kind="test.flaky", input={"fail_times": 5}, owner=owner)
    with caplog.at_level(logging.ERROR, logger="jobs.runner"):
        for _ in range(3):  # max_attempts
            job_execute(job_id=job.pk)
            Job.objects.filter(pk=job.pk).update(run_after=None)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    return job, owner


def test_the_owner_and_webhooks_see_no_traceback(failed_job, caplog):
    job, owner = failed_job
    client = Client()
    client.force_login(owner)
    api = client.get(f"/api/jobs/{job.pk}/").json()
    assert api["error"] == {"code": "exception", "message": "RuntimeError: planned failure on attempt 3"}
    assert no_traceback(json.dumps(client.get(f"/api/jobs/{job.pk}/events/").json()))
    assert no_traceback(client.get(f"/jobs/{job.pk}/").content.decode())
    assert no_traceback(json.dumps(job_as_dict(job)))
    assert no_traceback(json.dumps([event.message for event in JobEvent.objects.filter(job=job)]))
    delivery = WebhookDelivery.objects.get(event="failed")
    assert delivery.payload["job"]["error"]["message"] == "RuntimeError: planned failure on attempt 3"
    assert no_traceback(json.dumps(delivery.payload))
    # ... while the log and the admin keep it.
    logged = caplog.get_records("setup")  # the fixture ran the job
    assert any(record.exc_info and "planned failure" in str(record.exc_info[1]) for record in logged)
    admin = Client()
    admin.force_login(make_user("boss", superuser=True))
    page = admin.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "Traceback" in page and "planned failure on attempt 3" in page


def test_an_error_stored_before_with_its_traceback_in_the_message_is_shown_without_it():
    owner = make_user("shop")
    job, _ = job_submit(kind="demo.noop", owner=owner)
    old = "ValueError: boom\nTraceback (most recent call last):\n  File \"/app/jobs/runner.py\", line 1, in run\n"
    Job.objects.filter(pk=job.pk).update(error={"code": "exception", "message": old})
    job.refresh_from_db()
    client = Client()
    client.force_login(owner)
    assert client.get(f"/api/jobs/{job.pk}/").json()["error"]["message"] == "ValueError: boom"
    assert job_as_dict(job)["error"] == {"code": "exception", "message": "ValueError: boom"}
