"""Faults of workers, caused for real: kill -9 with jobs in flight, a poison job, SIGTERM, time
limits, the same message twice, and cancelling jobs in every state.

Each test runs its own Celery workers and beat with a short lease (2 s) and a fast reconciler,
against the test database and Redis, and checks that every job reached the expected terminal
state, that its event log is complete (seqs 1..n, no gap), and, through `demo.sleep`'s step
counts, that no finished step ran again: only the step in flight at a kill may run twice.
"""

from __future__ import annotations

import signal
import time

import pytest

from approvals.models import Question
from demo.services import step_runs
from jobs.models import Job
from jobs.services import job_cancel, job_dispatch, job_submit
from tests.support.processes import celery_beat, celery_worker, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.worker]

S = Job.Status
# Short enough that a test sees a dead worker's jobs come back within seconds.
CHAOS_ENV = {
    "JOBS_LEASE_SECONDS": "2",
    "JOBS_RECONCILE_INTERVAL": "0.5",
    "JOBS_CANCEL_GRACE": "1",
    "JOBS_DISPATCH_GRACE": "5",
}


class Cluster:
    """The workers and the beat of one test; all stopped (or killed) at the end."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.processes: list = []

    def worker(self, name: str, concurrency: int = 2, queues: str = "jobs"):
        process = celery_worker(name=name, concurrency=concurrency, queues=queues, env=CHAOS_ENV).start()
        self.processes.append(process)
        return process

    def beat(self):
        process = celery_beat(schedule_file=str(self.tmp_path / "beat-schedule"), env=CHAOS_ENV).start()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            process.stop(timeout=10)


@pytest.fixture
def cluster(only_own_workers, tmp_path):
    running = Cluster(tmp_path)
    running.beat()
    # Beat's housekeeping on a worker of its own, as deployed: job slots busy with long (or
    # stubborn) jobs do not hold up the reconciler.
    running.worker("platform", concurrency=1, queues="platform")
    yield running
    running.stop()


def sleep_job(seconds: float, steps: int) -> Job:
    return job_submit(kind="demo.sleep", input={"seconds": seconds, "steps": steps})[0]


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def finished(jobs: list[Job], timeout: float = 60.0) -> list[Job]:
    ids = [job.pk for job in jobs]
    wait_until(
        lambda: Job.objects.filter(pk__in=ids, status__in=Job.TERMINAL).count() == len(ids),
        timeout=timeout,
        interval=0.1,
        message=f"not finished: {list(Job.objects.filter(pk__in=ids).exclude(status__in=Job.TERMINAL).values_list('id', 'status'))}",  # noqa: E501
    )
    return [fresh(job) for job in jobs]


def assert_log_complete(job: Job) -> None:
    """Every event of the job is there: seqs 1..event_seq, no gap, no duplicate."""
    job = fresh(job)
    assert list(job.events.order_by("seq").values_list("seq", flat=True)) == list(range(1, job.event_seq + 1))


def statuses(job: Job) -> list[str]:
    return list(job.events.filter(type="status").order_by("seq").values_list("status", flat=True))


def steps_done(job: Job) -> int:
    return len(fresh(job).checkpoint)


def test_kill_9_of_a_worker_with_jobs_in_flight_loses_nothing_and_repeats_no_finished_step(cluster):
    first = cluster.worker("doomed", concurrency=2)
    jobs = [sleep_job(seconds=3, steps=6) for _ in range(4)]
    wait_until(
        lambda: sum(1 for job in jobs if fresh(job).status == S.PROCESSING and steps_done(job) >= 1) == 2,
        timeout=30,
        message="two jobs did not get under way",
    )
    in_flight = [job.pk for job in jobs if fresh(job).status == S.PROCESSING]
    first.kill()  # kill -9 of the whole worker: the pool's children die with their jobs

    cluster.worker("rescuer", concurrency=2)
    done = finished(jobs)
    for job in done:
        assert job.status == S.COMPLETED, (job.pk, job.status, job.error)
        assert_log_complete(job)
        runs = step_runs(job_id=job.pk)
        assert set(runs) == {str(n) for n in range(1, 7)}
        repeated = [step for step, count in runs.items() if count > 1]
        assert len(repeated) <= 1 and all(count <= 2 for count in runs.values()), runs
    for job in done:
        if job.pk in in_flight:
            # Taken back after its lease expired: one attempt lost, recorded, then finished.
            assert job.attempts == 2
            assert any(e.message.get("lease_expired") for e in job.events.filter(type="status", status="pending"))
        else:
            assert job.attempts == 1 and set(step_runs(job_id=job.pk).values()) == {1}


def test_a_poison_job_that_kills_its_worker_every_time_fails_as_worker_lost(cluster):
    worker = cluster.worker("victim", concurrency=1)
    job = job_submit(kind="test.crash", input={})[0]
    (job,) = finished([job], timeout=60)
    assert job.status == S.FAILED and job.error["code"] == "worker_lost" and job.attempts == job.max_attempts == 2
    assert step_runs(job_id=job.pk) == {"a": 1, "body": 2}  # the finished step did not run again
    assert_log_complete(job)
    # The worker survived its children's deaths and goes on taking jobs.
    assert worker.proc.poll() is None
    after = job_submit(kind="demo.noop", input={})[0]
    assert finished([after], timeout=30)[0].status == S.COMPLETED


def test_sigterm_hands_the_running_job_back_and_the_worker_exits_at_once(cluster):
    worker = cluster.worker("leaving", concurrency=1)
    job = sleep_job(seconds=30, steps=60)
    wait_until(lambda: steps_done(job) >= 2, timeout=30, message="the job did not get under way")
    started = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # to the main process only, as `docker stop` does
    worker.proc.wait(timeout=20)
    assert time.monotonic() - started < 10, "the warm shutdown waited for the job instead of handing it back"
    handed = fresh(job)
    assert handed.status == S.PENDING and handed.lease_expires_at is None
    assert handed.events.filter(type="status", status="pending", message__handed_back=True).exists()
    assert handed.max_attempts == 4  # the handed-back run is not held against the job

    cluster.worker("next", concurrency=1)
    wait_until(lambda: fresh(job).status == S.PROCESSING, timeout=30)
    job_cancel(job_id=job.pk)  # no need to sit through the rest
    (job,) = finished([job])
    runs = step_runs(job_id=job.pk)
    assert all(count == 1 for count in runs.values()), runs  # hand-back happens between steps
    assert_log_complete(job)


def test_a_kind_time_limit_fails_the_run_as_timeout_or_retries_it(cluster):
    cluster.worker("timer", concurrency=2)
    failing = job_submit(kind="test.overrun", input={"seconds": 30})[0]
    retrying = job_submit(kind="test.overrun_retry", input={"seconds": 30})[0]
    failing, retrying = finished([failing, retrying], timeout=40)
    assert failing.status == S.FAILED and failing.error["code"] == "timeout" and failing.attempts == 1
    assert retrying.status == S.FAILED and retrying.error["code"] == "timeout" and retrying.attempts == 2
    assert step_runs(job_id=retrying.pk) == {"a": 1, "body": 2}
    for job in (failing, retrying):
        assert_log_complete(job)


def test_the_same_message_twice_runs_the_job_once(cluster):
    cluster.worker("twice", concurrency=2)
    job = sleep_job(seconds=1, steps=4)
    job_dispatch(job=job)
    job_dispatch(job=job)
    (job,) = finished([job])
    assert job.status == S.COMPLETED and job.attempts == 1
    assert statuses(job) == ["pending", "processing", "completed"]
    assert step_runs(job_id=job.pk) == {str(n): 1 for n in range(1, 5)}
    assert_log_complete(job)


def test_cancelling_in_every_state_ends_cancelled_and_never_completed(cluster, reviewer):
    worker = cluster.worker("canceller", concurrency=1)
    running = sleep_job(seconds=20, steps=40)
    wait_until(lambda: steps_done(running) >= 1, timeout=30)
    queued = sleep_job(seconds=1, steps=2)  # behind `running` on the one slot: pending
    review = job_submit(kind="demo.review", input={"document": "d"})[0]

    assert job_cancel(job_id=queued.pk).status == S.CANCELLED  # pending
    done_at_cancel = steps_done(running)
    assert job_cancel(job_id=running.pk).status == S.CANCELLED  # processing: stops at its next ctx call
    wait_until(lambda: fresh(review).status == S.PAUSED, timeout=30)
    assert job_cancel(job_id=review.pk).status == S.CANCELLED  # paused
    assert Question.objects.get(job=review).status == Question.Status.CANCELLED

    # The worker goes on: a job sent after the cancellations runs to the end.
    after = sleep_job(seconds=0.2, steps=2)
    assert finished([after])[0].status == S.COMPLETED
    time.sleep(1)
    for job in (queued, running, review):
        job = fresh(job)
        assert job.status == S.CANCELLED and statuses(job)[-1] == "cancelled"
        assert_log_complete(job)
    assert step_runs(job_id=queued.pk) == {}  # never started
    assert fresh(queued).attempts == 0
    # The running job stopped within a step of the cancellation.
    assert len(step_runs(job_id=running.pk)) <= done_at_cancel + 1
    assert worker.proc.poll() is None


def test_a_cancelled_run_that_never_reaches_a_ctx_call_is_terminated_after_the_grace(cluster):
    worker = cluster.worker("stubborn", concurrency=1)
    job = job_submit(kind="test.stubborn", input={"seconds": 60})[0]
    wait_until(lambda: step_runs(job_id=job.pk).get("body"), timeout=30, message="the job did not start")
    job_cancel(job_id=job.pk)
    wait_until(
        lambda: job.events.filter(type="log", message__text__icontains="terminated").exists(),
        timeout=30,
        message="the run was not terminated",
    )
    worker.wait_for_output("Terminating", timeout=10)
    # The pool replaced the killed process: the worker takes the next job at once.
    after = job_submit(kind="demo.noop", input={})[0]
    assert finished([after], timeout=30)[0].status == S.COMPLETED
    job = fresh(job)
    assert job.status == S.CANCELLED and "b" not in step_runs(job_id=job.pk)
    assert_log_complete(job)
