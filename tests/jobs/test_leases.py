"""Leases, the heartbeat, the reconciler's take-back, hand-back and time limits, through the
services in-process (the same faults caused for real, with worker processes, are in
tests/chaos/test_workers.py)."""

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from jobs.leases import Heartbeat
from jobs.models import Job, JobStep
from jobs.registry import job_kind
from jobs.runtime import HandBack, JobContext
from jobs.services import (
    job_cancel,
    job_claim,
    job_complete,
    job_dispatch,
    job_hand_back,
    job_submit,
    jobs_recover_expired_leases,
    jobs_terminate_cancelled_runs,
)
from tests.support.commit import dispatches
from tests.support.processes import wait_until

S = Job.Status


def claimed(kind="demo.sleep", input=None, **claim):
    job, _ = job_submit(kind=kind, input=input if input is not None else {"seconds": 0, "steps": 1})
    return job_claim(job_id=job.pk, **claim)


def expire(job, seconds_ago=5):
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=seconds_ago))


@pytest.mark.django_db
def test_a_claim_takes_a_lease_in_the_workers_name_and_the_outcome_releases_it(settings):
    settings.JOBS_LEASE_SECONDS = 60
    before = timezone.now()
    job = claimed(worker="celery@host pid 7", task_id="t-1")
    assert job.worker == "celery@host pid 7" and job.task_id == "t-1"
    assert before + timedelta(seconds=59) < job.lease_expires_at < timezone.now() + timedelta(seconds=61)
    done = job_complete(job=job, result={})
    assert done.lease_expires_at is None and done.worker == "celery@host pid 7"


@pytest.mark.django_db
def test_an_expired_lease_sends_the_job_back_with_the_attempt_counted_and_steps_kept(
    django_capture_on_commit_callbacks,
):
    job = claimed(worker="celery@gone pid 1")
    JobStep.objects.create(job_id=job.pk, name="1", result={"step": 1}, attempt=1)
    expire(job)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert jobs_recover_expired_leases() == 1
    job.refresh_from_db()
    assert job.status == S.PENDING and job.attempts == 1 and job.lease_expires_at is None
    assert job.error["code"] == "worker_lost" and "celery@gone pid 1" in job.error["message"]
    assert job.checkpoint == {"1": {"step": 1}}
    last = job.events.order_by("-seq").first()
    assert last.status == "pending" and last.message["lease_expired"] is True and last.message["attempt"] == 1
    assert len(dispatches(callbacks)) == 1
    assert jobs_recover_expired_leases() == 0


@pytest.mark.django_db
def test_a_job_that_keeps_losing_its_worker_fails_as_worker_lost_after_its_attempts():
    job = claimed()
    Job.objects.filter(pk=job.pk).update(max_attempts=2)
    for attempt in (1, 2):
        job = job_claim(job_id=job.pk) if attempt > 1 else job
        assert job.attempts == attempt
        expire(job)
        assert jobs_recover_expired_leases() == 1
    job.refresh_from_db()
    assert job.status == S.FAILED and job.error["code"] == "worker_lost" and job.attempts == 2


@pytest.mark.django_db
def test_live_leases_and_other_statuses_are_left_alone():
    live = claimed()
    cancelled = claimed()
    job_cancel(job_id=cancelled.pk)
    expire(cancelled)
    assert jobs_recover_expired_leases() == 0
    assert Job.objects.get(pk=live.pk).status == S.PROCESSING
    assert Job.objects.get(pk=cancelled.pk).status == S.CANCELLED


@pytest.mark.django_db
def test_a_run_claimed_before_leases_existed_is_judged_by_its_start(settings):
    settings.JOBS_LEASE_SECONDS = 10
    job = claimed()
    Job.objects.filter(pk=job.pk).update(lease_expires_at=None, started_at=timezone.now() - timedelta(seconds=30))
    assert jobs_recover_expired_leases() == 1
    assert Job.objects.get(pk=job.pk).status == S.PENDING


@pytest.mark.django_db
def test_the_take_back_loses_to_a_renewal_that_comes_first(monkeypatch):
    import jobs.services

    job = claimed()
    expire(job)
    real_transition = jobs.services.reconciling.job_transition

    def renewed_first(**kwargs):
        # The heartbeat renews between the reconciler's read and its conditional update.
        Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=60))
        return real_transition(**kwargs)

    monkeypatch.setattr(jobs.services.reconciling, "job_transition", renewed_first)
    assert jobs_recover_expired_leases() == 0
    assert Job.objects.get(pk=job.pk).status == S.PROCESSING


@pytest.mark.django_db
def test_a_hand_back_returns_the_job_without_spending_an_attempt(django_capture_on_commit_callbacks):
    job = claimed()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        back = job_hand_back(job=job, reason="worker celery@a is shutting down")
    assert back.status == S.PENDING and back.attempts == 1 and back.max_attempts == 4
    assert back.lease_expires_at is None
    assert back.events.order_by("-seq").first().message["handed_back"] is True
    assert len(dispatches(callbacks)) == 1


@pytest.mark.django_db
def test_a_draining_worker_stops_the_run_before_the_next_step():
    job = claimed()
    ctx = JobContext(job, worker_hostname="celery@a")
    ran = []
    ctx.step("first", lambda: ran.append("first") or 1)
    ctx.hand_back_requested = True
    with pytest.raises(HandBack):
        ctx.step("second", lambda: ran.append("second") or 2)
    with pytest.raises(HandBack):
        ctx.progress(0.5)
    assert ran == ["first"]


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_renews_the_leases_of_the_runs_in_its_process(settings):
    settings.JOBS_LEASE_SECONDS = 0.6  # renewed every 0.2 s
    job = claimed()
    first = job.lease_expires_at
    beat = Heartbeat()
    ctx = JobContext(job)
    beat.add(ctx)
    try:
        renewed = wait_until(
            lambda: Job.objects.filter(pk=job.pk, lease_expires_at__gt=first + timedelta(seconds=0.3)).exists(),
            timeout=10,
            message="the lease was not renewed",
        )
        assert renewed
    finally:
        beat.remove(ctx)
    # Once the run is gone the lease is left to expire.
    wait_until(lambda: Job.objects.get(pk=job.pk).lease_expires_at < timezone.now(), timeout=10)


@pytest.mark.django_db
def test_a_heartbeat_running_long_before_a_run_does_not_renew_it_before_a_third_of_its_lease(settings):
    """Each run is renewed a third of a lease after its own claim, not on the process's clock: a
    worker process up for hours once renewed a run claimed a moment before, at its first tick.
    (In a test whose transaction the heartbeat's connection cannot see, that renewal found no
    row and stopped a healthy run as lost.)"""
    settings.JOBS_LEASE_SECONDS = 60
    job = claimed()
    beat = Heartbeat()
    try:
        with mock.patch.object(beat, "_renew") as renew:
            beat._stopped.wait(1.5)  # the process has been up for a while
            ctx = JobContext(job)
            beat.add(ctx)
            beat._stopped.wait(2.5)  # two ticks or more with the run in it
            assert renew.call_count == 0 and not ctx.lost
            ctx.lease_until -= 21  # a third of the lease later
            # On call_args, not call_count: a mock counts a call before it records its arguments,
            # and the call is made on the heartbeat's thread.
            wait_until(lambda: renew.call_args is not None, timeout=5, message="the run was not renewed")
            assert renew.call_args.args[0] == [ctx]
    finally:
        beat.stop()


@pytest.mark.django_db
def test_a_cancelled_run_still_alive_after_the_grace_is_revoked_once_per_renewal():
    job = claimed(task_id="task-123")
    job_cancel(job_id=job.pk)
    # The run is still renewing its lease; the cancellation is 60 s old.
    Job.objects.filter(pk=job.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=30), finished_at=timezone.now() - timedelta(seconds=60)
    )
    with mock.patch("taskplatform.celery.app.control.revoke") as revoke:
        assert jobs_terminate_cancelled_runs(grace=30) == 1
        assert jobs_terminate_cancelled_runs(grace=30) == 0  # lease cleared: not again until renewed
    revoke.assert_called_once_with("task-123", terminate=True, signal="SIGKILL")
    job.refresh_from_db()
    assert job.status == S.CANCELLED and job.lease_expires_at is None
    assert "terminated" in job.events.order_by("-seq").first().message["text"]


@pytest.mark.django_db
def test_a_recent_cancellation_is_given_its_grace():
    job = claimed(task_id="task-9")
    job_cancel(job_id=job.pk)
    with mock.patch("taskplatform.celery.app.control.revoke") as revoke:
        assert jobs_terminate_cancelled_runs(grace=30) == 0
    revoke.assert_not_called()


def test_a_kind_with_a_time_limit_is_sent_with_it():
    # The options of the message, as Celery gets them (a message sent from a template carries
    # the same: tests/test_run_messages.py).
    job = Job(kind="test.overrun")
    with mock.patch("jobs.services.transitions.run_message_send", return_value=False), \
            mock.patch("jobs.tasks.job_run.apply_async") as send:
        job_dispatch(job=job)
        assert send.call_args.kwargs["soft_time_limit"] == 1 and send.call_args.kwargs["time_limit"] == 61
        job_dispatch(job=Job(kind="demo.noop"))
        assert "soft_time_limit" not in send.call_args.kwargs


@pytest.mark.parametrize("options, error", [
    ({"on_time_limit": "later"}, "on_time_limit"), ({"time_limit": 0}, "time_limit"),
])
def test_kind_time_limit_options_are_checked_at_import(options, error):
    with pytest.raises(ValueError, match=error):
        job_kind("test.bad_limits", **options)


def test_a_reconciler_pass_during_a_database_outage_is_skipped_with_a_warning(caplog):
    from django.db import OperationalError

    from jobs.tasks import jobs_reconcile

    with mock.patch("jobs.tasks.jobs_redispatch_stale", side_effect=OperationalError("connection refused")):
        assert jobs_reconcile() == {}
    assert "reconciler pass skipped" in caplog.text


def test_a_forked_child_starts_a_heartbeat_of_its_own():
    """A pool process is forked from the worker's main process: the parent's heartbeat (its
    thread did not come along) is not the child's, which starts its own at its first job."""
    import os

    from jobs.leases import heartbeat

    parent = heartbeat()
    assert heartbeat() is parent and parent.pid == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, whatever happens
        try:
            child = heartbeat()
            ok = child is not parent and child.pid == os.getpid() and heartbeat() is child
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 2)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"ok"
    assert heartbeat() is parent
