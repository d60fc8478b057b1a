"""A stateful model of message delivery (Hypothesis), against the real Redis and PostgreSQL: jobs
submitted; worker processes that take messages from the queue as kombu's BRPOP does, publish what
they hold (`jobs.broker.held_publish`, as `jobs.tasks.HeldPublisher` does on its tick), run them,
are killed (their messages gone with them: the broker keeps no copy, there is no acknowledgement
emulation) or shut down cleanly (their unstarted messages back in the queue); and the reconciler's
passes in between. Whatever the interleaving, a job completes at most once, and once the faults
stop and the workers drain the queue, every job has completed. A longer run:
DELIVERY_MODEL_EXAMPLES=500 DELIVERY_MODEL_STEPS=60."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.test import TestCase
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from jobs.broker import held_forget, held_key, held_publish
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit, jobs_redispatch_stale

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the model runs against PostgreSQL"),
]

WORKERS = 3
worker_index = st.integers(0, WORKERS - 1)


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def forget_every_message(client: redis.Redis) -> None:
    keys = list(client.scan_iter(f"{settings.REDIS_KEY_PREFIX}*"))
    if keys:
        client.delete(*keys)


def job_of(raw: bytes) -> str:
    """The job id a `jobs.run` message runs."""
    return json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]


@dataclass
class WorkerProcess:
    index: int
    generation: int = 0
    taken: list[bytes] = field(default_factory=list)  # taken from the queue, not yet run
    published: bool = False

    @property
    def holder(self) -> str:
        return f"model-{self.index}@host/{self.generation}/0"

    def replaced(self) -> None:
        """Its process is gone: a new one starts under a holder name of its own."""
        self.generation += 1
        self.taken.clear()
        self.published = False


class DeliveryModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._savepoint = transaction.savepoint()
        self.client = broker()
        self.queue = f"{settings.REDIS_KEY_PREFIX}jobs"
        forget_every_message(self.client)
        self.reconcile()  # the broker is known: no "lost its data" pass later
        self.workers = [WorkerProcess(index) for index in range(WORKERS)]
        self.jobs: list[str] = []
        self.completed: Counter[str] = Counter()
        self.unpublished_losses: set[str] = set()

    def teardown(self) -> None:
        try:
            self.drain()
        finally:
            transaction.savepoint_rollback(self._savepoint)
            forget_every_message(self.client)
            self.client.close()

    # -- the platform's side -------------------------------------------------------------------
    def reconcile(self) -> None:
        # A grace of 0: every pending job is judged at every pass (the clock plays no part).
        with TestCase.captureOnCommitCallbacks(execute=True):
            jobs_redispatch_stale(grace=0.0)

    def run(self, worker: WorkerProcess, raw: bytes) -> None:
        job_id = job_of(raw)
        with TestCase.captureOnCommitCallbacks(execute=True):
            outcome = job_execute(job_id=job_id, worker=f"{worker.holder} pid 0", worker_hostname=worker.holder,
                                  task_id="model")
        if outcome == "completed":
            self.completed[job_id] += 1

    def publish(self, worker: WorkerProcess) -> None:
        held_publish(worker.holder, [job_of(raw) for raw in worker.taken])
        worker.published = True

    # -- rules -------------------------------------------------------------------------------------
    @rule()
    def submit(self) -> None:
        with TestCase.captureOnCommitCallbacks(execute=True):
            job, _ = job_submit(kind="demo.noop", input={})
        self.jobs.append(str(job.pk))

    @rule(index=worker_index)
    def take(self, index: int) -> None:
        raw = self.client.rpop(self.queue)
        if raw is not None:
            self.workers[index].taken.append(raw)

    @rule(index=worker_index)
    def publish_what_it_holds(self, index: int) -> None:
        self.publish(self.workers[index])

    @rule(index=worker_index)
    def run_one(self, index: int) -> None:
        worker = self.workers[index]
        if worker.taken:
            self.run(worker, worker.taken.pop(0))

    @rule(index=worker_index)
    def kill(self, index: int) -> None:
        """kill -9: what it took is gone. What it last published ages past JOBS_HELD_STALE_AFTER
        (written here with that age, rather than waited for)."""
        worker = self.workers[index]
        raw = self.client.hget(held_key(), worker.holder)
        published: set[str] = set()
        if raw is not None:
            record = json.loads(raw)
            published = set(record["jobs"])
            seconds, micros = self.client.time()
            record["at"] = seconds + micros / 1e6 - settings.JOBS_HELD_STALE_AFTER - 1
            self.client.hset(held_key(), worker.holder, json.dumps(record))
        # Taken and not yet published: nobody can know where these went until the queue is empty.
        self.unpublished_losses.update(job_of(raw) for raw in worker.taken if job_of(raw) not in published)
        worker.replaced()

    @rule(index=worker_index)
    def shut_down(self, index: int) -> None:
        """A warm shutdown: kombu puts the unstarted messages back, the worker removes its record."""
        worker = self.workers[index]
        for raw in worker.taken:
            self.client.lpush(self.queue, raw)
        held_forget(worker.holder)
        worker.replaced()

    @rule()
    def reconciler_pass(self) -> None:
        """After a pass, every pending job has a message queued or in a live worker's hands, but
        for one a killed worker took and had not yet published while other messages were queued
        (sent again once the queue is empty, `test_a_message_lost_between_the_queue_...`): the
        messages a dead worker had published as held are sent again at once, however long the
        queue."""
        queue_was_empty = self.client.llen(self.queue) == 0
        self.reconcile()
        queued = {job_of(raw) for raw in self.client.lrange(self.queue, 0, -1)}
        in_hand = {job_of(raw) for worker in self.workers for raw in worker.taken}
        pending = {str(pk) for pk in Job.objects.filter(pk__in=self.jobs, status=Job.Status.PENDING)
                   .values_list("pk", flat=True)}
        unaccounted = pending - queued - in_hand
        if queue_was_empty:
            self.unpublished_losses.clear()  # the pass found nothing queued: it sent them all
        assert unaccounted <= self.unpublished_losses, unaccounted - self.unpublished_losses

    @invariant()
    def no_job_completes_twice(self) -> None:
        assert all(count == 1 for count in self.completed.values()), self.completed

    # -- the end: faults stop, the workers drain ----------------------------------------------------
    def drain(self) -> None:
        for _ in range(4):
            for worker in self.workers:
                while worker.taken:
                    self.run(worker, worker.taken.pop(0))
                self.publish(worker)
            self.reconcile()
            first = self.workers[0]
            while (raw := self.client.rpop(self.queue)) is not None:
                self.run(first, raw)
        pending = Job.objects.filter(pk__in=self.jobs).exclude(status=Job.Status.COMPLETED).values_list(
            "pk", "status")
        assert not list(pending), "jobs left without a message after the drain"
        assert sorted(self.completed) == sorted(self.jobs) and set(self.completed.values()) <= {1}


@pytest.fixture
def quiet():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def test_every_job_completes_once_whatever_the_workers_do(quiet, settings):
    settings.JOBS_RETRY_BACKOFF_BASE = 0.0
    settings.JOBS_RETRY_BACKOFF_MAX = 0.0
    run_state_machine_as_test(
        DeliveryModel,
        settings=hypothesis_settings(
            max_examples=int(os.environ.get("DELIVERY_MODEL_EXAMPLES", "25")),
            stateful_step_count=int(os.environ.get("DELIVERY_MODEL_STEPS", "30")), deadline=None, database=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
