"""A run's writes before it hands work out are fenced to the run (issue 13, item 10): a run whose
job was cancelled or taken back submits nothing, leaves no active wait, and cannot consume the
live run's wake."""

from __future__ import annotations

import pytest

from jobs.events import RunLost
from jobs.models import Job
from jobs.services import job_cancel, job_submit, jobs_recover_expired_leases
from tests.support.runs import claim, finish, fresh, run
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import wake_token, wake_token_redeem

pytestmark = pytest.mark.django_db
S = Job.Status


class Service:
    """Records what the runs hand out and check."""

    def __init__(self) -> None:
        self.submitted: list[str] = []
        self.checked: list[str] = []

    def body(self, key: str = "a"):
        def submit(token, url):
            self.submitted.append(token)
            return f"ext-{len(self.submitted)}"

        def check(external_id):
            self.checked.append(external_id)
            return CheckResult.pending()

        return lambda ctx: ctx.wait_for(key, submit=submit, check=check)


def test_a_run_whose_job_was_cancelled_submits_nothing_and_leaves_no_active_wait():
    service = Service()
    job, _ = job_submit(kind="demo.noop", input={})
    ctx = claim(job.pk)
    job_cancel(job_id=job.pk)
    assert finish(ctx, service.body()) == "lost"
    assert service.submitted == []
    assert not Wait.objects.filter(job=job, state__in=Wait.ACTIVE).exists()
    assert fresh(job).status == S.CANCELLED


def test_a_stale_run_neither_consumes_the_live_runs_wake_nor_calls_the_service():
    service = Service()
    job, _ = job_submit(kind="demo.noop", input={})
    stale = claim(job.pk)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=fresh(job).started_at)
    assert jobs_recover_expired_leases() == 1  # its worker looked dead: taken back
    assert run(job.pk, service.body()) == "waiting"  # the next run parked on `a`
    wait = Wait.objects.get(job=job)
    wake_token_redeem(token=wake_token(wait.token_salt))  # the service called back
    woken = Wait.objects.get(pk=wait.pk).woken_at
    assert woken is not None and fresh(job).status == S.PENDING

    with pytest.raises(RunLost):
        service.body()(stale)  # the old run comes back to life and reaches the same wait
    wait.refresh_from_db()
    assert wait.woken_at == woken and wait.executions == 1
    assert service.checked == [] and len(service.submitted) == 1
    # The live run's look finds the wake.
    assert run(job.pk, service.body()) == "waiting"
    assert service.checked == ["ext-1"]
