"""A finished job holds nothing open, and its last event is its status event (found by the model,
tests/model): its questions and waits close before the status event, whatever ends it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Question
from jobs.models import Job
from jobs.services import job_cancel, job_submit
from tests.support.runs import claim, finish, fresh, run
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import waits_resume_due

pytestmark = pytest.mark.django_db
S = Job.Status


def last_events(job, n=2):
    return [(e.type, e.status) for e in fresh(job).events.order_by("-seq")[:n]][::-1]


def park_on(key):
    return lambda ctx: ctx.wait_for(key, submit=lambda token, url: "ext", check=lambda _: CheckResult.pending())


@pytest.mark.parametrize("suspend", ["question", "wait"])
def test_cancelling_a_suspended_job_closes_what_it_waits_for_before_its_last_event(suspend):
    job, _ = job_submit(kind="demo.noop", input={})
    body = (lambda ctx: ctx.ask("q", "Go?")) if suspend == "question" else park_on("w")
    assert run(job.pk, body) in ("paused", "waiting")
    job_cancel(job_id=job.pk)
    closed = ("question", "cancelled") if suspend == "question" else ("wait", "failed")
    assert last_events(job) == [closed, ("status", "cancelled")]


def test_a_job_that_ends_without_coming_back_to_its_wait_closes_it():
    job, _ = job_submit(kind="demo.noop", input={})
    assert run(job.pk, park_on("w")) == "waiting"
    Wait.objects.filter(job=job).update(next_due_at=timezone.now() - timedelta(seconds=1))
    assert waits_resume_due() == 1
    assert run(job.pk, lambda ctx: {"took": "another path"}) == "completed"
    wait = Wait.objects.get(job=job)
    assert wait.state == Wait.State.CANCELLED and wait.error["code"] == "abandoned"
    assert last_events(job) == [("wait", "failed"), ("status", "completed")]


def test_a_wait_whose_submit_broke_is_closed_when_the_job_fails_for_good():
    job, _ = job_submit(kind="demo.noop", input={})
    Job.objects.filter(pk=job.pk).update(max_attempts=1)

    def broken(token, url):
        raise KeyError("the submit's own bug")

    ctx = claim(job.pk)
    assert finish(ctx, lambda ctx: ctx.wait_for("w", submit=broken, check=lambda _: None)) == "failed"
    assert Wait.objects.get(job=job).state == Wait.State.CANCELLED
    assert not Question.objects.filter(job=job).exists()
    assert last_events(job, 1) == [("status", "failed")]
