"""What a handler or a step may return: JSON that PostgreSQL can store. Anything else fails the
job at once with a clear code (issue 13, items 5 and 6), instead of leaving it `processing` until
its lease runs out or retrying a value that can never be stored."""

import pytest

from demo.services import step_runs
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit

pytestmark = pytest.mark.django_db
S = Job.Status

NOT_STORABLE = ["datetime", "decimal", "set", "nan", "infinity", "nul", "nul_key", "surrogate"]


def step_events(job):
    return [(e.step, e.status) for e in Job.objects.get(pk=job.pk).events.filter(type="step").order_by("seq")]


@pytest.mark.parametrize("value", NOT_STORABLE)
def test_a_result_that_is_not_json_fails_the_job_at_once(value):
    job, _ = job_submit(kind="test.returns", input={"value": value})
    assert job_execute(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.status == S.FAILED and job.error["code"] == "result_not_json", job.error
    assert job.attempts == 1 and job.lease_expires_at is None and job.result is None
    assert list(job.events.order_by("seq").values_list("seq", flat=True)) == list(range(1, job.event_seq + 1))


def test_a_json_result_is_stored_as_is():
    job, _ = job_submit(kind="test.returns", input={"value": "fine"})
    assert job_execute(job_id=job.pk) == "completed"
    assert Job.objects.get(pk=job.pk).result == {"ok": [1, 2.5, "x", None, True]}


@pytest.mark.parametrize("value", NOT_STORABLE)
def test_a_step_result_that_cannot_be_stored_fails_the_job_before_the_step_counts_as_done(value):
    job, _ = job_submit(kind="test.step_returns", input={"value": value})
    assert job_execute(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.error["code"] == "step_result_not_json", job.error
    assert job.attempts == 1 and job.checkpoint == {}
    assert step_events(job) == [("awkward", "started"), ("awkward", "failed")]
    assert step_runs(job_id=job.pk) == {"awkward": 1}


def test_a_type_error_raised_by_the_steps_own_code_is_an_ordinary_error_and_retried():
    job, _ = job_submit(kind="test.step_type_error", input={})
    assert job_execute(job_id=job.pk) == "pending"  # retried after its back-off
    job.refresh_from_db()
    assert job.error["code"] == "exception" and "TypeError: unsupported operand" in job.error["message"]
    job.__class__.objects.filter(pk=job.pk).update(run_after=None)
    assert job_execute(job_id=job.pk) == "completed"
    assert Job.objects.get(pk=job.pk).result == {"value": "fine the second time"}
