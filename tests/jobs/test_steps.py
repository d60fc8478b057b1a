"""A finished step never runs again (issue 13, item 7): its result is kept even when its run lost
the job meanwhile (cancelled, taken back), the first finished result wins and nothing overwrites
another run's checkpoint, and an old run still alive stops before a new run of the job starts."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.events import RunLost
from jobs.leases import Heartbeat
from jobs.models import Job
from jobs.services import (
    job_cancel,
    job_claim,
    job_retry,
    job_submit,
    jobs_recover_expired_leases,
    run_lease_release,
)
from tests.support.commit import dispatches
from tests.support.processes import wait_until
from tests.support.runs import claim, fresh

S = Job.Status


def new_job():
    return job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})[0]


def take_back(job):
    # A second ago: the database's clock may keep fewer digits than this host's (SQLite: milliseconds).
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert jobs_recover_expired_leases() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("lose", ["cancel", "take_back"])
def test_a_step_that_finishes_after_its_run_lost_the_job_is_kept(lose):
    job = new_job()
    old = claim(job.pk)

    def body():
        job_cancel(job_id=job.pk) if lose == "cancel" else take_back(job)
        return {"charged": 42}

    with pytest.raises(RunLost):
        old.step("charge", body)
    assert fresh(job).checkpoint == {"charge": {"charged": 42}}
    if lose == "cancel":
        job_retry(job_id=job.pk)
        run_lease_release(job=old.job)  # the runner does this when the old run stops
    new = claim(job.pk)
    assert new.step("charge", lambda: pytest.fail("a finished step ran again")) == {"charged": 42}
    # The lost run wrote no event after the job's final one.
    assert list(fresh(job).events.values_list("seq", flat=True).order_by("seq")) == list(
        range(1, fresh(job).event_seq + 1))


@pytest.mark.django_db
def test_the_first_finished_result_wins_and_no_run_overwrites_anothers_steps():
    job = new_job()
    old = claim(job.pk)
    runs = []

    def overtaken(result):
        """The old run's step: while it works, its job is taken back and a new run finishes steps."""
        def body():
            take_back(job)
            runs.append(claim(job.pk))
            assert runs[-1].step("one", lambda: "new") == "new"
            return result
        return body

    # The old run finishes `one` after the new run did: the new run's result stays.
    with pytest.raises(RunLost):
        old.step("one", overtaken("old"))
    assert fresh(job).checkpoint == {"one": "new"}

    # An old run finishes a step the new run has not reached: kept, and nothing else is touched.
    older = runs[-1]
    with pytest.raises(RunLost):
        older.step("three", overtaken("older"))
    assert fresh(job).checkpoint == {"one": "new", "three": "older"}
    # The live run gets the stored result, not its own, and the step does not run again.
    assert runs[-1].step("three", lambda: pytest.fail("a finished step ran again")) == "older"


@pytest.mark.django_db
def test_a_retried_job_waits_for_its_cancelled_run_to_stop_before_a_new_run_starts(
    django_capture_on_commit_callbacks,
):
    job = new_job()
    old = claim(job.pk)
    job_cancel(job_id=job.pk)
    job_retry(job_id=job.pk)  # the cancelled run is still alive (in the middle of a step)
    with pytest.raises(InvalidTransition):
        job_claim(job_id=job.pk)
    assert fresh(job).status == S.PENDING and fresh(job).attempts == 1
    with pytest.raises(RunLost):
        old.progress(0.5)  # its next ctx call stops it...
    with django_capture_on_commit_callbacks(execute=False) as callbacks, transaction.atomic():
        run_lease_release(job=old.job)  # ...and the runner releases its lease: the job is sent again
    assert len(dispatches(callbacks)) == 1
    assert claim(job.pk).attempt == 2


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_stops_a_run_that_lost_its_job_before_its_lease_ends(settings, only_own_workers):
    settings.JOBS_LEASE_SECONDS = 0.9
    job = new_job()
    ctx = claim(job.pk)
    stopped = []
    beat = Heartbeat(terminate=lambda: stopped.append(time.monotonic()))
    beat.add(ctx)
    try:
        job_cancel(job_id=job.pk)
        job_retry(job_id=job.pk)  # the old run's lease is no longer renewed
        lease = fresh(job).lease_expires_at
        wait_until(lambda: stopped, timeout=10, message="the heartbeat did not stop the lost run")
        assert fresh(job).lease_expires_at == lease  # not renewed for a run that lost its job
        with pytest.raises(RunLost):
            ctx.step("next", lambda: pytest.fail("a lost run started a step"))
    finally:
        beat.remove(ctx)
        beat.stop()


@pytest.mark.django_db(transaction=True)
def test_a_step_on_postgresql_opens_no_transaction(monkeypatch):
    """A step's begin and its checkpoint are one statement each (the job's UPDATE with its
    event's INSERT): autocommit, as a run's other moves, with no BEGIN and COMMIT around them."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("elsewhere a step's writes take a transaction of their own")
    job = new_job()
    ctx = claim(job.pk)
    opened = []
    real_enter = transaction.Atomic.__enter__
    monkeypatch.setattr(transaction.Atomic, "__enter__", lambda self: opened.append(1) or real_enter(self))
    assert ctx.step("one", lambda: {"done": 1}) == {"done": 1}
    assert opened == []
    assert fresh(job).checkpoint == {"one": {"done": 1}}
    assert list(fresh(job).events.order_by("seq").values_list("type", "status"))[-2:] == [
        ("step", "started"), ("step", "completed")]
