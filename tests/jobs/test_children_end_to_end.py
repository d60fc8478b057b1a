"""A parent of 200 children with real Celery workers and beat: some children ask a person, the
worker is killed (kill -9) in the middle. The parent holds no worker while its children run
(it is `waiting`), resumes exactly once, and nothing is lost: every child ends completed, once,
with a complete event log, and no finished step runs again.

Short children (one step of 50 ms) keep it within CI's means on two cores; `bench/` can do more."""

from __future__ import annotations

import time

import pytest

from approvals.models import Question
from approvals.services import question_answer
from demo.services import step_runs
from jobs.models import Job
from jobs.services import job_submit
from tests.conftest import make_user
from tests.support.processes import celery_beat, celery_worker, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

S = Job.Status
# A dispatch grace longer than the queue takes to drain: a shorter one re-sends every queued child.
# A message that the killed worker took and held without claiming its child is sent again once the
# reconciler sees the worker dead (it stopped publishing what it holds: jobs.broker), not after its
# mark's hour.
ENV = {"JOBS_LEASE_SECONDS": "2", "JOBS_RECONCILE_INTERVAL": "0.5", "JOBS_DISPATCH_GRACE": "15"}
NOOP, ASK = 190, 10


@pytest.fixture
def processes(only_own_workers, tmp_path):
    started = [
        celery_beat(schedule_file=str(tmp_path / "beat-schedule"), env=ENV).start(),
        celery_worker(name="platform", concurrency=1, queues="platform", env=ENV).start(),
    ]
    yield started
    for process in started:
        process.stop(timeout=10)


def count(parent: Job, **filters) -> int:
    return Job.objects.filter(parent=parent, **filters).count()


def test_200_children_some_asking_a_person_through_a_kill_9(processes):
    rita = make_user("rita", reviewer=True)
    doomed = celery_worker(name="doomed", concurrency=2, queues="jobs", env=ENV).start()
    processes.append(doomed)
    started = time.monotonic()
    parent, _ = job_submit(kind="test.fanout", input={"noop": NOOP, "ask": ASK, "nap": 0.02, "policy": "collect"})

    # The parent spawns its 200 children and parks: waiting, no lease, no worker.
    wait_until(lambda: Job.objects.get(pk=parent.pk).status == S.WAITING, timeout=60,
               message="the parent did not park")
    assert count(parent) == NOOP + ASK
    held = Job.objects.get(pk=parent.pk)
    assert held.lease_expires_at is None

    # kill -9 in the middle: some children finished, some running, the rest still queued.
    wait_until(lambda: count(parent, status=S.COMPLETED) >= 30, timeout=60, message="the children did not start")
    in_flight = count(parent, status=S.PROCESSING)
    doomed.kill()
    finished_at_kill = count(parent, status=S.COMPLETED)
    assert finished_at_kill < NOOP, "every child finished before the kill: make the children slower"
    assert Job.objects.get(pk=parent.pk).status == S.WAITING  # still parked: a kill costs it nothing
    print(f"[{time.monotonic() - started:.1f}s] killed with {finished_at_kill} children done, {in_flight} running")

    # Another worker takes over; the children that ask wait for a person, who answers.
    processes.append(celery_worker(name="rescuer", concurrency=2, queues="jobs", env=ENV).start())
    answered = 0
    while answered < ASK:
        wait_until(lambda: Question.objects.filter(job__parent=parent, status="open").exists(), timeout=90,
                   message=f"no more questions opened after {answered} answers")
        assert Job.objects.get(pk=parent.pk).status == S.WAITING
        for question in Question.objects.filter(job__parent=parent, status="open"):
            question_answer(question_id=question.pk, user=rita, answer={"approved": True})
            answered += 1
    print(f"[{time.monotonic() - started:.1f}s] answered {answered} questions")

    try:
        wait_until(lambda: Job.objects.get(pk=parent.pk).is_finished, timeout=180, interval=0.2)
    except AssertionError:
        unfinished = list(
            Job.objects.filter(parent=parent).exclude(status=S.COMPLETED).values_list("spawn_key", "status")
        )
        raise AssertionError(f"the parent did not finish ({Job.objects.get(pk=parent.pk).status}); "
                             f"children not completed: {unfinished}") from None
    print(f"[{time.monotonic() - started:.1f}s] the parent finished")
    parent = Job.objects.get(pk=parent.pk)
    assert parent.status == S.COMPLETED, parent.error
    assert parent.result == {"statuses": ["completed"] * (NOOP + ASK), "ok": NOOP + ASK}

    # Resumed exactly once: one park, one wake, one more run.
    events = list(parent.events.filter(type="status").order_by("seq").values_list("status", flat=True))
    assert events == ["pending", "processing", "waiting", "pending", "processing", "completed"], events

    # Nothing lost, nothing doubled: 200 children, each completed with a gapless log, and no
    # finished step ran again (only a step in flight at the kill may have run twice).
    children = list(Job.objects.filter(parent=parent))
    assert len(children) == NOOP + ASK and len({child.spawn_key for child in children}) == NOOP + ASK
    for child in children:
        assert child.status == S.COMPLETED
        assert list(child.events.order_by("seq").values_list("seq", flat=True)) == list(range(1, child.event_seq + 1))
    repeated = [child for child in children if child.kind == "demo.sleep" and step_runs(job_id=child.pk)["1"] > 1]
    assert len(repeated) <= max(in_flight, 2), (len(repeated), in_flight)
    print(f"step re-runs after the kill: {len(repeated)}")
