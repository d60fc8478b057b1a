"""Exactly one resume, whatever races: each of the four ways to end a combined wait (the callback,
a backup check, a person, the deadline), delivered twice at the same moment, and a callback and a
person arriving together, 50 times each, on PostgreSQL with a connection per thread. A resume is
a `status` event into `pending`; the loser is told what came first.

The jobs run in this process (`test.combined`: a pretend service, no HTTP) and their dispatch is
not sent, so nothing else takes them; `test_combined_end_to_end.py` does each once with a real
worker."""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user
from tests.waitkinds.kinds import seen, service_finish
from waits.errors import WaitBusy, WaitEnded, WakeTokenInvalid
from waits.models import Wait
from waits.people import wait_expire, wait_provide
from waits.services import waits_resume_due, wake_token_redeem

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("only_own_workers")]
REPEAT = 50


@pytest.fixture(autouse=True)
def unsent(monkeypatch):
    """Keep every dispatch unsent: the test runs each job itself."""
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)


class Racers:
    """Two threads, each with its own database connection for the whole test (opening one per
    race would cost more than the race): `racers(call_a, call_b)` releases both calls at once
    through a barrier and returns what each returned or raised, in order."""

    def __init__(self, count: int = 2) -> None:
        self.inboxes: list[queue.Queue] = [queue.Queue() for _ in range(count)]
        self.outbox: queue.Queue = queue.Queue()
        self.barrier = threading.Barrier(count)
        self.threads = [threading.Thread(target=self._serve, args=(index,), daemon=True) for index in range(count)]
        for thread in self.threads:
            thread.start()

    def _serve(self, index: int) -> None:
        try:
            while (call := self.inboxes[index].get()) is not None:
                try:
                    self.barrier.wait(timeout=10)
                    result = call()
                except BaseException as exc:  # noqa: BLE001 (reported to the test)
                    result = exc
                self.outbox.put((index, result))
        finally:
            connections.close_all()

    def __call__(self, *calls: Callable[[], Any]) -> list[Any]:
        for inbox, call in zip(self.inboxes, calls, strict=True):
            inbox.put(call)
        results = dict(self.outbox.get(timeout=30) for _ in calls)
        return [results[index] for index in range(len(calls))]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=10)


@pytest.fixture
def run_together(transactional_db):
    racers = Racers()
    yield racers
    racers.close()


@pytest.fixture
def people(transactional_db):
    return make_user("ann", reviewer=True), make_user("bob", reviewer=True)


def parked(**input) -> tuple[Job, Wait]:
    job, _ = job_submit(kind="test.combined", input={"marks": [600, 1200], **input})
    job_execute(job_id=job.pk)
    assert Job.objects.get(pk=job.pk).status == "waiting"
    return job, Wait.objects.get(job=job)


def resumes(job: Job) -> int:
    """Moves into `pending` after the submit."""
    return job.events.filter(type="status", status="pending").count() - 1


def finish(job: Job) -> Job:
    job_execute(job_id=job.pk)
    job = Job.objects.get(pk=job.pk)
    assert job.status == "completed", (job.status, job.error)
    return job


def test_a_callback_delivered_twice_at_once_resumes_once(people, run_together):
    for _ in range(REPEAT):
        job, _ = parked()
        token = seen(job.pk, "tokens")[0]
        results = run_together(lambda token=token: wake_token_redeem(token=token),
                               lambda token=token: wake_token_redeem(token=token))
        assert sorted(type(r).__name__ for r in results) == ["Wait", "WakeTokenInvalid"], results
        assert resumes(job) == 1
        service_finish(job.pk, "the service's")
        assert finish(job).result == {"text": "the service's", "ended_by": "callback"}


def test_two_beat_passes_at_once_resume_a_due_check_once(people, run_together):
    for _ in range(REPEAT):
        job, wait = parked()
        Wait.objects.filter(pk=wait.pk).update(next_due_at=timezone.now() - timedelta(seconds=1))
        results = run_together(lambda: waits_resume_due(limit=5), lambda: waits_resume_due(limit=5))
        assert sorted(results) == [0, 1], results
        assert resumes(job) == 1
        service_finish(job.pk, "found by the check")
        assert finish(job).result == {"text": "found by the check", "ended_by": "check"}


def test_two_people_providing_at_once_resume_once_and_the_second_is_told_who(people, run_together):
    ann, bob = people
    for _ in range(REPEAT):
        job, wait = parked()
        results = run_together(lambda wait=wait: wait_provide(wait_id=wait.pk, user=ann, result={"text": "ann"}),
                               lambda wait=wait: wait_provide(wait_id=wait.pk, user=bob, result={"text": "bob"}))
        won = [r for r in results if isinstance(r, Wait)]
        lost = [r for r in results if isinstance(r, WaitEnded)]
        assert len(won) == 1 and len(lost) == 1, results
        winner = won[0].result["text"]
        assert f"{winner} provided the result" in lost[0].message
        assert resumes(job) == 1
        assert finish(job).result == {"text": winner, "ended_by": "person"}


def test_two_deadline_passes_at_once_apply_the_policy_once(people, run_together):
    past = timezone.now() + timedelta(hours=2)
    for _ in range(REPEAT):
        job, wait = parked(timeout=3600, on_timeout={"action": "default", "answer": {"text": "fallback"}})
        results = run_together(lambda wait=wait: wait_expire(wait_id=wait.pk, now=past),
                               lambda wait=wait: wait_expire(wait_id=wait.pk, now=past))
        assert sorted(results, key=str) == [None, "default"], results
        assert resumes(job) == 1
        assert finish(job).result == {"text": "fallback", "ended_by": "deadline"}


def test_a_callback_and_a_person_together_resume_once_and_the_loser_is_told_who_won(people, run_together):
    ann, _ = people
    wins: Counter = Counter()
    for _ in range(REPEAT):
        job, wait = parked()
        token = seen(job.pk, "tokens")[0]
        service_finish(job.pk, "the service's")
        callback, person = run_together(
            lambda token=token: wake_token_redeem(token=token),
            lambda wait=wait: wait_provide(wait_id=wait.pk, user=ann, result={"text": "ann's"}),
        )
        if isinstance(callback, Wait):  # the callback came first: the person is told
            assert isinstance(person, WaitBusy) and "the service called back first" in person.message, person
            expected = {"text": "the service's", "ended_by": "callback"}
        else:  # the person came first: the callback is told
            assert isinstance(person, Wait) and isinstance(callback, WakeTokenInvalid), (callback, person)
            assert "ann provided the result" in callback.message
            expected = {"text": "ann's", "ended_by": "person"}
        assert resumes(job) == 1
        assert finish(job).result == expected
        wins[expected["ended_by"]] += 1
    print(f"callback and person together, {REPEAT} times: won by {dict(wins)}")
