"""A worker whose clock is 5 minutes ahead, then one 5 minutes behind (libfaketime): nothing is
taken back early, nothing runs twice, and no deadline fires early or late by more than one pass.

The worker runs under Debian's `faketime`, which shifts `time.time()` and `datetime.now()` in the
process and its pool, but not the monotonic clock (`FAKETIME_DONT_FAKE_MONOTONIC=1`): with it
faked, a lock's or an event's timeout never ends, and Celery's timers need both. libfaketime 0.9.10
then breaks Python's `time.sleep` (its `clock_nanosleep` on the real monotonic clock is shifted
all the same: EINVAL), so the worker gets a `sitecustomize` that sleeps with `select` instead. This test's process
plays the other host, with the true clock: it runs the periodic passes itself, one after the
other (`reconcile`'s lease recovery, the question deadlines, the waits' due looks), so that it
knows which pass did what. Each `test.clock` job steps for longer than a lease (the worker's
heartbeat must keep it), asks a question whose deadline passes (its default answers it) and
parks on a polled wait; the job notes the database's time before the question and before the
wait, so that the test knows when each was due without trusting any host's clock.

A deadline fired early when the pass that fired it ended before the deadline could have come; it
fired late by more than one pass when the pass after the first one that began past the latest
moment it could have come had not fired it.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from approvals.models import Question
from approvals.services import questions_expire_due
from demo.services import step_runs
from jobs.models import Job, JobEvent
from jobs.services import job_submit, jobs_recover_expired_leases
from tests.support.processes import celery_worker
from waits.models import Wait
from waits.services import waits_resume_due

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.worker,
    # SQLite's clock is each process's own (the library runs in it): a worker's wrong clock is the
    # database's clock there, and one file serves one host. Several hosts need a database server.
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the database's clock is a server's (PostgreSQL)"),
]

FAKETIME = shutil.which("faketime")
LEASE = 6.0  # the worker's lease: renewed every 2 s
BUSY = 9.0  # step `a` outlives one and a half leases
TIMEOUT = 6.0  # the question's deadline
POLL = 5.0  # the wait's first look
JOBS = 2
PASS_PAUSE = 1.0  # between two passes
MAX_PASSES = 90  # a run that needs more has a deadline at least a minute late


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


@dataclass
class Pass:
    number: int
    began: datetime
    ended: datetime | None = None


@dataclass
class Deadline:
    """When one job's question or wait was due, as far as the test can tell, and which pass fired it."""

    earliest: datetime | None = None  # the job's note + the delay: it cannot have been due sooner
    latest: datetime | None = None  # first seen open + the delay: it was due by then
    fired_by: Pass | None = None

    def verdict(self, passes: list[Pass]) -> str:
        if self.fired_by is None:
            return "never fired"
        if self.fired_by.ended < self.earliest:
            early = (self.earliest - self.fired_by.ended).total_seconds()
            return f"early: pass {self.fired_by.number} ended {early:.1f}s before it could be due"
        due = next((p for p in passes if self.latest is not None and p.began >= self.latest), None)
        if due is not None and self.fired_by.number > due.number + 1:
            return f"late: fired by pass {self.fired_by.number}, due by pass {due.number}"
        return f"on time: fired by pass {self.fired_by.number}" + (f", due by pass {due.number}" if due else "")


@dataclass
class Watch:
    job_id: object
    question: Deadline = field(default_factory=Deadline)
    wait: Deadline = field(default_factory=Deadline)


def _observe(watch: Watch, job: Job, seen_at: datetime, state: str) -> None:
    """What the snapshot taken at `seen_at` (before a pass) shows of the job."""
    checkpoint = job.checkpoint or {}
    if "before_ask" in checkpoint and watch.question.earliest is None:
        watch.question.earliest = datetime.fromisoformat(checkpoint["before_ask"]) + timedelta(seconds=TIMEOUT)
    if "before_wait" in checkpoint and watch.wait.earliest is None:
        watch.wait.earliest = datetime.fromisoformat(checkpoint["before_wait"]) + timedelta(seconds=POLL)
    if state == "question open" and watch.question.latest is None:
        watch.question.latest = seen_at + timedelta(seconds=TIMEOUT)
    if state == "wait parked" and watch.wait.latest is None:
        watch.wait.latest = seen_at + timedelta(seconds=POLL)


def _state(job: Job) -> str:
    if job.status == Job.Status.PAUSED and Question.objects.filter(job=job, key="q", status="open").exists():
        return "question open"
    if job.status == Job.Status.WAITING and Wait.objects.filter(job=job, key="w", next_due_at__isnull=False).exists():
        return "wait parked"
    return job.status


SLEEP_WITH_SELECT = """import select
import time


def _sleep(seconds):
    select.select([], [], [], max(float(seconds), 0.0))


time.sleep = _sleep
"""


def run_against_skewed_worker(skew: str, shim: Path) -> dict:
    """Run JOBS `test.clock` jobs on a worker whose clock is off by `skew` (faketime's syntax),
    with this process's passes as the other host. Returns what happened, for the assertions."""
    (shim / "sitecustomize.py").write_text(SLEEP_WITH_SELECT)
    python_path = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    env = {"JOBS_LEASE_SECONDS": str(LEASE), "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": python_path}
    worker = celery_worker(name="ahead" if skew.startswith("+") else "behind", queues="jobs", env=env)
    worker.argv = [FAKETIME, "-f", skew, *worker.argv]
    worker.start()
    try:
        watches = {job.pk: Watch(job.pk) for job in (
            job_submit(kind="test.clock", input={"busy": BUSY, "timeout": TIMEOUT, "poll": POLL})[0]
            for _ in range(JOBS))}
        passes: list[Pass] = []
        recovered = 0
        while len(passes) < MAX_PASSES:
            began = database_now()
            before = {job.pk: (job, _state(job)) for job in Job.objects.filter(pk__in=list(watches))}
            for job_id, (job, state) in before.items():
                _observe(watches[job_id], job, began, state)
            if all(job.status in Job.TERMINAL for job, _ in before.values()):
                break
            current = Pass(len(passes) + 1, began)
            recovered += jobs_recover_expired_leases()
            questions_expire_due()
            waits_resume_due()
            current.ended = database_now()
            passes.append(current)
            for job in Job.objects.filter(pk__in=list(watches)):
                was = before[job.pk][1]
                watch = watches[job.pk]
                if was == "question open" and Question.objects.filter(job=job, key="q").exclude(status="open").exists():
                    watch.question.fired_by = watch.question.fired_by or current
                if was == "wait parked" and job.status != Job.Status.WAITING:
                    watch.wait.fired_by = watch.wait.fired_by or current
            time.sleep(PASS_PAUSE)
        jobs = {job.pk: job for job in Job.objects.filter(pk__in=list(watches))}
        # The worker's clock against the database's, as the first job saw them.
        clocks = next(iter(jobs.values())).checkpoint.get("clocks") or {}
        offset = round((datetime.fromisoformat(clocks["worker"]) - datetime.fromisoformat(clocks["database"])
                        ).total_seconds(), 1) if clocks else None
        return {
            "skew": skew,
            "passes": passes,
            "recovered": recovered,
            "taken_back": JobEvent.objects.filter(job_id__in=list(watches), message__lease_expired=True).count(),
            # A run that failed, was taken back or handed back says why in its status event.
            "errors": list(JobEvent.objects.filter(job_id__in=list(watches), message__has_key="error").values_list(
                "message__error__code", flat=True)),
            "statuses": {str(pk): job.status for pk, job in jobs.items()},
            "attempts": {str(pk): job.attempts for pk, job in jobs.items()},
            "step_runs": {str(pk): step_runs(job_id=pk) for pk in watches},
            "questions": {str(pk): watch.question.verdict(passes) for pk, watch in watches.items()},
            "waits": {str(pk): watch.wait.verdict(passes) for pk, watch in watches.items()},
            "worker_ahead_by": offset,
        }
    finally:
        worker.stop()


@pytest.mark.parametrize("skew", ["+5m", "-5m"])
def test_a_worker_with_a_wrong_clock_takes_nothing_back_early_runs_nothing_twice_and_keeps_deadlines(
    skew, only_own_workers, tmp_path,
):
    if FAKETIME is None:
        reason = "faketime (Debian's libfaketime) is not installed: apt-get install faketime"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    seen = run_against_skewed_worker(skew, tmp_path)
    print(f"\nworker clock {skew} (ahead of the database's by {seen['worker_ahead_by']}s): "
          f"{len(seen['passes'])} passes; {seen['recovered']} job(s) taken back "
          f"({seen['taken_back']} lease_expired event(s)); statuses {sorted(seen['statuses'].values())}; "
          f"runs {sorted(seen['attempts'].values())} (ask, wait, end: 3 each); errors {seen['errors']}; "
          f"step runs {list(seen['step_runs'].values())}; "
          f"question deadlines {list(seen['questions'].values())}; wait marks {list(seen['waits'].values())}")
    assert seen["recovered"] == seen["taken_back"] == 0, f"a lease was taken back while its worker was alive: {seen}"
    most = max((count for runs in seen["step_runs"].values() for count in runs.values()), default=0)
    assert most <= 1, f"a step ran twice: {seen}"
    assert seen["errors"] == [], f"a run failed or was taken back: {seen}"
    on_time = [verdict.startswith("on time") for verdict in [*seen["questions"].values(), *seen["waits"].values()]]
    assert all(on_time), f"a question's deadline or a wait's look fired off time: {seen}"
    assert set(seen["statuses"].values()) == {"completed"}, seen
    assert all(runs == {"a": 1, "b": 1} for runs in seen["step_runs"].values()), seen
