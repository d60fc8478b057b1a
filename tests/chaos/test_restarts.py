"""Restarts of the servers (issue 7, point 7): Redis restarting empty and PostgreSQL restarting,
each caused for real on a private server while a real worker, Celery beat and the web server run
on it. Every job must reach its expected terminal state by itself, with its event log gapless and
no finished step run again (`demo.sleep` counts its step bodies outside the job's checkpoint).
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
import redis
from celery import Celery

from tests.chaos.servers import JobFollower, JobsDatabase, Platform
from tests.support.processes import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.worker]

PREFIX = "chaos:"
QUEUE_KEY = f"{PREFIX}jobs"  # the Redis list that holds the `jobs` queue's messages
# Short enough for a test, long enough to tell a direct dispatch from the reconciler's.
GRACE = 4.0
ENV = {
    "JOBS_DISPATCH_GRACE": str(GRACE),
    "JOBS_RECONCILE_INTERVAL": "0.5",
    "WAITS_DUE_INTERVAL": "0.25",
    "LOG_LEVEL": "INFO",
    "WORKER_TASK_LOG": "true",  # the workers' `Task … received` lines are read below
}


def assert_gapless(db: JobsDatabase, job_id: str, event_seq: int) -> None:
    seqs = db.event_seqs(job_id)
    assert seqs == list(range(1, event_seq + 1)), f"job {job_id}: events {seqs}, event_seq {event_seq}"
    last = db.events(job_id)[-1]
    assert last[1] == "status" and last[3] in ("completed", "failed", "cancelled"), (job_id, last)


def assert_sleep_ran_once(db: JobsDatabase, job_id: str, steps: int) -> None:
    """Every step of a `demo.sleep` job ran exactly once (none repeated, none skipped)."""
    assert db.step_runs(job_id) == {str(n): 1 for n in range(1, steps + 1)}, (job_id, db.step_runs(job_id))


def queue_length(url: str) -> int:
    """How many `jobs.run` messages wait in the `jobs` queue (beat's tasks may share it)."""
    client = redis.Redis.from_url(url)
    try:
        messages = [json.loads(raw) for raw in client.lrange(QUEUE_KEY, 0, -1)]
    finally:
        client.close()
    return sum(1 for message in messages if message.get("headers", {}).get("task") == "jobs.run")


def control(redis_url: str) -> Celery:
    """A Celery app in this process that talks to the private broker (remote control)."""
    app = Celery("chaos-control", broker=redis_url, set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": PREFIX}
    return app


# -- Redis restarts empty -----------------------------------------------------------------------------
def test_redis_restarts_empty_with_jobs_pending_waiting_and_processing(
    private_redis, second_redis, chaos_database, chaos_db, tmp_path
):
    platform = Platform(database_url=chaos_database, redis_url=private_redis.url, workdir=tmp_path, env=ENV,
                        concurrency=2, service_redis_url=second_redis.url, prefix=PREFIX)
    try:
        platform.start()
        db = chaos_db
        # Parked on the outside service (which keeps its own state in another Redis): done after
        # 0.5 s, no callback, so only the backup check at 3 s, found due in the database, wakes them.
        waiting = [platform.submit("test.wait", {"delay": 0.5, "drop_callback": True, "marks": [3, 6, 30]})
                   for _ in range(2)]
        wait_until(lambda: set(db.statuses(waiting).values()) == {"waiting"}, timeout=20,
                   message=f"the waits did not park: {db.statuses(waiting)}")
        # Two long jobs hold both pool processes through the restart (the second frees its
        # process a little after the restart, for the jobs submitted then)...
        busy = [platform.submit("demo.sleep", {"seconds": seconds, "steps": seconds}) for seconds in (6, 3)]
        wait_until(lambda: set(db.statuses(busy).values()) == {"processing"}, timeout=20,
                   message=f"the long jobs did not start: {db.statuses(busy)}")
        # A websocket client follows the longer one across the restart.
        follower = JobFollower(platform.web_url, platform.api_token(), busy[0]).start()
        # These wait their turn as messages in Redis (or reserved by the worker).
        queued = [platform.submit("demo.sleep", {"seconds": 0.2, "steps": 2}) for _ in range(4)]
        wait_until(lambda: queue_length(private_redis.url) >= 2, timeout=5,
                   message="the queued jobs' messages are not in Redis")
        assert set(db.statuses(queued).values()) == {"pending"}

        private_redis.restart_empty(down_for=1.0)
        restarted_at, restarted_wall = time.monotonic(), time.time()

        # Jobs submitted at once, before the worker is back (it retries every 2 s and more): the
        # web server publishes their messages into the empty Redis, and they run when the worker
        # reconnects, not only when the reconciler finds them after the grace.
        after = [platform.submit("demo.sleep", {"seconds": 0.1, "steps": 1})]
        time.sleep(0.5)
        after.append(platform.submit("demo.sleep", {"seconds": 0.1, "steps": 1}))
        assert platform.healthz() == 200

        every = waiting + busy + queued + after
        statuses = db.wait_terminal(every, timeout=60)
        recovered_in = time.monotonic() - restarted_at
        assert set(statuses.values()) == {"completed"}, statuses

        jobs = db.jobs(every)
        for job_id in every:
            assert_gapless(db, job_id, jobs[job_id]["event_seq"])
        for job_id, steps in zip(busy, (6, 3), strict=True):
            assert_sleep_ran_once(db, job_id, steps)
            assert jobs[job_id]["attempts"] == 1, jobs[job_id]  # the run in flight went on
        for job_id in waiting:  # woken by beat's look at the database, after the restart
            assert ("wait", "woken") in [(event[1], event[3]) for event in db.events(job_id)]
        for job_id in queued:
            assert_sleep_ran_once(db, job_id, 2)
        for job_id in after:
            assert_sleep_ran_once(db, job_id, 1)
            job = jobs[job_id]
            assert (job["started_at"] - job["created_at"]).total_seconds() < GRACE, job
        # Same processes all along: they reconnected, nobody restarted them.
        for process in platform.processes:
            assert process.proc.poll() is None, f"{process.name} died:\n{process.output[-3000:]}"
        # The web server's channel layer is back too: the follower got every event of its job,
        # once each and in order, and those written two seconds after the restart were pushed
        # live again (not only found by the consumers' periodic catch-up, every 5 s).
        wait_until(follower.finished_at, timeout=15, message=f"the websocket missed the end: {follower.seqs()}")
        follower.stop()
        assert follower.error is None, follower.error
        assert follower.seqs() == list(range(1, jobs[busy[0]]["event_seq"] + 1)), follower.seqs()
        live = follower.delays(written_after=restarted_wall + 2.0)
        assert live and max(live) < 1.0, [round(delay, 2) for delay in live]
        print(f"\nredis restart: all {len(every)} jobs completed {recovered_in:.1f}s after the restart; "
              f"pushes after it took {[round(delay, 2) for delay in live]}s")
    finally:
        platform.stop()


# -- PostgreSQL restarts ------------------------------------------------------------------------------
def worker_hostname() -> str:
    """The name `tests.support.processes.celery_worker` gives the chaos worker."""
    return f"chaos-worker-{os.getpid()}@{socket.gethostname()}"


def test_postgres_restart_worker_and_web_reconnect_and_pending_jobs_proceed(
    private_redis, private_postgres, chaos_database, chaos_db, tmp_path
):
    platform = Platform(database_url=chaos_database, redis_url=private_redis.url, workdir=tmp_path, env=ENV,
                        concurrency=2, prefix=PREFIX)
    db = chaos_db
    try:
        platform.start()
        # Warm up: both pool processes and the web server's pool now hold connections that the
        # restart will kill.
        warm = [platform.submit("demo.sleep", {"seconds": 0.05, "steps": 1}) for _ in range(4)]
        db.wait_terminal(warm, timeout=20)
        for _ in range(5):
            assert platform.healthz() == 200

        # Three jobs whose messages reach the worker while PostgreSQL is down: the worker stops
        # consuming, they are submitted, the database goes away, the worker consumes again.
        app = control(private_redis.url)
        assert app.control.cancel_consumer("jobs", destination=[worker_hostname()], reply=True, timeout=5)
        held = [platform.submit("demo.sleep", {"seconds": 0.05, "steps": 2}) for _ in range(3)]
        assert queue_length(private_redis.url) == 3
        private_postgres.stop("fast")

        def received() -> int:
            return sum("received" in line and "demo.sleep[" in line for line in list(platform.worker.lines))

        before = received()
        assert app.control.add_consumer("jobs", destination=[worker_hostname()], reply=True, timeout=5)
        # Taken (and their claims failed, then retried by Celery): a retried message may be back in
        # the queue for a moment, so what counts is that the worker received all three.
        try:
            wait_until(lambda: received() >= before + 3, timeout=15)
        except AssertionError:
            raise AssertionError(
                f"the worker did not take the messages while the database was down (queue: "
                f"{queue_length(private_redis.url)}):\n{platform.worker.output[-6000:]}") from None
        time.sleep(1.0)  # their claims fail now
        private_postgres.start()
        restarted_at = time.monotonic()

        # The web server serves again by itself (its pool may first wait out a reconnect back-off),
        # and then no request fails on a connection the restart killed.
        wait_until(lambda: platform.healthz() == 200, timeout=20, interval=0.2,
                   message="the web server did not serve again after the restart")
        codes = [platform.healthz() for _ in range(12)]
        after = [platform.submit("demo.sleep", {"seconds": 0.05, "steps": 1}) for _ in range(4)]
        assert codes == [200] * 12, codes

        statuses = db.wait_terminal(held + after, timeout=40)
        recovered_in = time.monotonic() - restarted_at
        assert set(statuses.values()) == {"completed"}, statuses
        jobs = db.jobs(held + after)
        for job_id in held + after:
            assert_gapless(db, job_id, jobs[job_id]["event_seq"])
            # A claim that failed with the database away never counted: one attempt, no error.
            assert jobs[job_id]["attempts"] == 1 and jobs[job_id]["error"] is None, jobs[job_id]
        for job_id in held:
            assert_sleep_ran_once(db, job_id, 2)
        # The worker's pool processes reconnected by themselves: the jobs submitted after the
        # restart were claimed and run at their first delivery, not failed and not retried.
        for job_id in after:
            job = jobs[job_id]
            assert (job["started_at"] - job["created_at"]).total_seconds() < GRACE, job
        for process in platform.processes:
            assert process.proc.poll() is None, f"{process.name} died:\n{process.output[-3000:]}"
        print(f"\npostgres restart: all jobs completed {recovered_in:.1f}s after the restart")
    finally:
        platform.stop()


def test_postgres_restart_with_jobs_in_flight(private_redis, private_postgres, chaos_database, chaos_db, tmp_path):
    platform = Platform(database_url=chaos_database, redis_url=private_redis.url, workdir=tmp_path,
                        env={**ENV, "JOBS_LEASE_SECONDS": "3"}, concurrency=2, prefix=PREFIX)
    db = chaos_db
    try:
        platform.start()
        busy = [platform.submit("demo.sleep", {"seconds": 3, "steps": 6}) for _ in range(2)]
        wait_until(lambda: set(db.statuses(busy).values()) == {"processing"}, timeout=20,
                   message=f"the long jobs did not start: {db.statuses(busy)}")
        queued = [platform.submit("demo.sleep", {"seconds": 0.1, "steps": 2}) for _ in range(3)]
        time.sleep(1.2)  # a few steps finished, one in flight
        private_postgres.restart(down_for=1.0)

        every = busy + queued
        statuses = db.wait_terminal(every, timeout=45)
        assert set(statuses.values()) == {"completed"}, statuses
        jobs = db.jobs(every)
        for job_id in every:
            assert_gapless(db, job_id, jobs[job_id]["event_seq"])
        for job_id in busy:
            runs = db.step_runs(job_id)
            assert set(runs) == {str(n) for n in range(1, 7)}, runs
            # Only a step in flight when a run was lost may have run twice: at most one per lost run.
            repeated = [step for step, count in runs.items() if count > 1]
            assert all(count <= 2 for count in runs.values()), runs
            assert len(repeated) <= jobs[job_id]["attempts"] - 1, (runs, jobs[job_id])
        for job_id in queued:
            assert_sleep_ran_once(db, job_id, 2)
        for job_id in busy:
            # The restart is not the job's fault: its run is handed back (or taken back by the
            # lease), never failed as an `exception` that spends the job's retries.
            errors = db._rows(
                "SELECT message->'error'->>'code' FROM jobs_jobevent WHERE job_id::text = %s AND type = 'status' "
                "AND message ? 'error'", [job_id])
            assert all(code == "worker_lost" for (code,) in errors), errors
    finally:
        platform.stop()
