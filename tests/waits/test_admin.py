"""A person stands in for the service from the admin: sees what a job waits for, checks now, cancels."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from jobs.models import Job
from tests.conftest import make_user
from tests.support.processes import wait_until
from tests.waits.helpers import finished, parked, submit, the_wait
from waits.models import Wait

pytestmark = pytest.mark.worker


@pytest.fixture
def admin_client_(stack) -> Client:
    client = Client()
    client.force_login(make_user("boss", superuser=True))
    return client


def test_the_job_page_shows_what_it_waits_for(admin_client_):
    job = submit("test.wait", delay=3600, marks=[60, 120, 180])
    wait = parked(job)
    page = admin_client_.get(reverse("admin:jobs_job_change", args=[job.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert wait.external_id in html and "simulated generation" in html
    page = admin_client_.get(reverse("admin:waits_wait_change", args=[wait.pk]))
    assert page.status_code == 200 and "Check now" in page.content.decode()
    assert admin_client_.get(reverse("admin:waits_wait_changelist")).status_code == 200


def test_check_now_and_cancel(admin_client_):
    job = submit("test.wait", delay=3600, marks=[60, 120, 180])
    wait = parked(job)
    response = admin_client_.post(reverse("admin:waits_wait_check_now", args=[wait.pk]))
    assert response.status_code == 302
    wait_until(lambda: Wait.objects.filter(pk=wait.pk, checks=1, job__status=Job.Status.WAITING).exists(),
               timeout=20, message="check now did not check")
    woken = job.events.filter(type="wait", status="woken").last()
    assert woken.message == {"by": "admin", "user": "boss"}

    admin_client_.post(reverse("admin:waits_wait_cancel", args=[wait.pk]))
    job = finished(job, timeout=5)
    assert job.status == Job.Status.CANCELLED
    assert the_wait(job).state == Wait.State.CANCELLED


def test_cancelling_a_waiting_job_closes_its_wait(stack):
    from jobs.services import job_cancel

    job = submit("test.wait", delay=3600, marks=[60, 120, 180])
    wait = parked(job)
    job_cancel(job_id=job.pk)
    wait.refresh_from_db()
    assert wait.state == Wait.State.CANCELLED and wait.next_due_at is None
    assert job.events.filter(type="wait", status="failed").last().message["code"] == "cancelled"
