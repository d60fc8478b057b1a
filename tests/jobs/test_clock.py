"""One clock, the database's (`jobs.clock`): nothing compares a time from one host's clock with
another's.

Every time that one process writes and another compares (a lease, a retry's due time, the
dispatch grace, a question's deadline, a wait's marks and deadline, a webhook's next attempt, the
scheduler's lease) is written and compared with the database's clock. These tests keep it so:

- the modules that write or compare those times read no host clock (`timezone.now()`,
  `datetime.now()`, `time.time()`), except on a line that says why (`# host clock: ...`: a time
  only people read, or one an outside party checks against its own clock);
- the model fields that hold them take no default from a host's clock;
- a claim, a renewal, a retry and the reconciler, run with this host's clock an hour off, write
  and judge by the database's.

The same with real processes, a worker 5 minutes ahead and one behind: tests/chaos/test_clocks.py.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.utils import timezone

from approvals.models import Decision, Question
from jobs.clock import clock_shift, database_now, db_now, db_now_plus
from jobs.models import Job
from jobs.services import job_claim, job_fail, job_submit, jobs_recover_expired_leases, jobs_redispatch_stale
from ops.models import PeriodicPass, SchedulerLease
from waits.models import Wait
from webhooks.models import WebhookDelivery

ROOT = Path(settings.BASE_DIR)

# Where the shared times are written or compared.
CLOCK_MODULES = [
    "jobs/clock.py", "jobs/leases.py", "jobs/broker.py", "jobs/events.py", "jobs/runner.py", "jobs/services/*.py",
    "approvals/runtime.py", "approvals/services/*.py",
    "waits/runtime.py", "waits/services.py", "waits/people.py", "waits/selectors.py",
    "webhooks/services.py", "ops/scheduler.py", "ops/workers.py",
]
HOST_CLOCK = re.compile(
    r"\btimezone\.now\b|\bdatetime\.(utc)?now\b|\btime\.time\("
    r"|from django\.utils\.timezone import|from time import time"
)
ALLOWED = "# host clock:"

# The columns another host compares.
SHARED_TIMES = {
    Job: ["lease_expires_at", "run_after", "updated_at", "started_at", "finished_at"],
    Question: ["expires_at", "answered_at"],
    Decision: ["created_at"],
    Wait: ["next_due_at", "deadline_at", "accepted_at", "woken_at"],
    WebhookDelivery: ["next_attempt_at"],
    SchedulerLease: ["acquired_at", "renewed_at", "expires_at"],
    PeriodicPass: ["last_started_at", "last_finished_at", "last_succeeded_at"],
}


def host_clock_reads() -> list[str]:
    found = []
    for pattern in CLOCK_MODULES:
        for path in sorted(ROOT.glob(pattern)):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if HOST_CLOCK.search(line) and ALLOWED not in line:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_the_modules_that_write_or_compare_shared_times_read_no_host_clock():
    found = host_clock_reads()
    assert not found, (
        "these read the host's clock where another host compares the time: use jobs.clock (db_now(), "
        "db_now_plus(), database_now()), or say why the host's clock is right with '# host clock: ...':\n"
        + "\n".join(found)
    )


def test_the_grep_looks_where_it_should():
    # A pattern that matched nothing (a moved module) would make the test above pass for nothing.
    for pattern in CLOCK_MODULES:
        assert list(ROOT.glob(pattern)), pattern
    assert HOST_CLOCK.search("    now = timezone.now()")
    assert HOST_CLOCK.search("stamp = time.time()") and not HOST_CLOCK.search("time.monotonic()")


def test_no_shared_time_takes_a_default_from_a_hosts_clock():
    for model, names in SHARED_TIMES.items():
        for name in names:
            field = model._meta.get_field(name)
            label = f"{model.__name__}.{name}"
            assert not field.auto_now and not field.auto_now_add, f"{label}: auto_now is this host's clock"
            assert field.default is not timezone.now, f"{label}: default=timezone.now is this host's clock"


def host_clock_off(offset: timedelta):
    """This process's `timezone.now()` off by `offset` (as on a host whose clock is wrong)."""
    real = timezone.now
    return mock.patch("django.utils.timezone.now", lambda: real() + offset)


@pytest.mark.django_db
def test_a_lease_and_a_back_off_are_written_and_judged_by_the_databases_clock():
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
    with host_clock_off(timedelta(hours=-1)):  # a worker an hour behind
        run = job_claim(job_id=job.pk)
    left = (run.lease_expires_at - database_now()).total_seconds()
    assert 0 < left <= settings.JOBS_LEASE_SECONDS, f"the lease ends in {left:.0f}s by the database's clock"
    assert abs((run.updated_at - database_now()).total_seconds()) < 60
    with host_clock_off(timedelta(hours=1)):  # a reconciler an hour ahead
        assert jobs_recover_expired_leases() == 0
        jobs_redispatch_stale(grace=settings.JOBS_DISPATCH_GRACE)
    assert Job.objects.get(pk=job.pk).attempts == 1
    with host_clock_off(timedelta(hours=1)):  # a worker an hour ahead fails the run
        retried = job_fail(job=run, code="boom", message="planned")
    assert retried.status == Job.Status.PENDING
    wait = (retried.run_after - database_now()).total_seconds()
    assert wait <= settings.JOBS_RETRY_BACKOFF_MAX, f"the retry is due in {wait:.0f}s by the database's clock"


@pytest.mark.django_db
def test_the_harness_clock_moves_the_databases_clock_for_the_platform():
    before = database_now()
    with clock_shift(lambda: timedelta(hours=2)):
        shifted = database_now()
        job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
        Job.objects.filter(pk=job.pk).update(run_after=db_now_plus(60))
        assert Job.objects.filter(pk=job.pk, run_after__gt=db_now()).exists()
    assert timedelta(hours=2) <= shifted - before < timedelta(hours=2, minutes=1)
    assert Job.objects.get(pk=job.pk).run_after - database_now() > timedelta(hours=2)


def test_a_time_from_now_is_one_object_per_seconds_and_a_moved_clock_gets_its_own():
    # Kept by their seconds while the clock is not moved (a claim's lease, a retry's delay): the
    # moves find their statements' shapes on them. A moved clock must not be served from there.
    assert db_now_plus(60) is db_now_plus(60) is db_now_plus(60.0)
    assert db_now_plus(0) is db_now()
    unmoved = db_now_plus(60)
    with clock_shift(lambda: timedelta(hours=2)):
        moved = db_now_plus(60)
        assert moved is not unmoved
        assert "seconds=7260" in str(moved)  # two hours and a minute
    assert db_now_plus(60) is unmoved
