"""Messages and the reconciler (issue 13, items 11 and 12): a slow message is never sent again, a
lost one is, a backlog does not multiply itself, a duplicate message does not run a retry before
its back-off ends, and a broker that lost its data gets every pending job's message at once."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from datetime import timedelta
from unittest import mock

import pytest
import redis
from django.conf import settings
from django.utils import timezone
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobs.broker import held_key, held_messages, held_publish, mark_key
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_submit, jobs_redispatch_stale, jobs_submit_many, transitions
from tests.support.processes import celery_worker, wait_until

S = Job.Status


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def job_messages() -> int:
    """`jobs.run` messages in the broker: waiting in the `jobs` queue, or held by a live worker (as
    it last published what it holds)."""
    from jobs import broker as broker_module

    return broker_module.job_messages()


def forget_every_message() -> None:
    """Empty the test run's broker keys (as a Redis that restarted empty)."""
    client = broker()
    try:
        keys = list(client.scan_iter(f"{settings.REDIS_KEY_PREFIX}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.mark.django_db
def test_a_duplicate_message_does_not_run_a_retry_before_its_back_off_ends(django_capture_on_commit_callbacks):
    job, _ = job_submit(kind="test.flaky", input={"fail_times": 5})
    assert job_execute(job_id=job.pk) == "pending"
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() + timedelta(seconds=60))
    with mock.patch("jobs.services.transitions.job_dispatch") as dispatch:
        assert job_execute(job_id=job.pk) == "deferred"  # a duplicate message, early
    job.refresh_from_db()
    assert job.status == S.PENDING and job.attempts == 1
    # It comes back when the back-off ends (in case it was the only message).
    assert 55 < dispatch.call_args.kwargs["countdown"] <= 61


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_backlog_behind_busy_workers_is_not_multiplied_and_only_lost_messages_are_sent_again(
    only_own_workers, settings
):
    grace = settings.JOBS_DISPATCH_GRACE = 1.0
    forget_every_message()
    worker = celery_worker(name="busy", concurrency=1).start()
    try:
        busy, _ = job_submit(kind="demo.sleep", input={"seconds": 600, "steps": 600})
        wait_until(lambda: Job.objects.get(pk=busy.pk).status == S.PROCESSING, timeout=30,
                   message="the worker did not take the long job")
        # 2,000 jobs queue behind it; 10 more lose their message (the process died between the
        # commit and the publish: the batch's early marks run out after the grace).
        jobs_submit_many(kind="demo.noop", inputs=[{}] * 2000)
        with mock.patch("jobs.services.transitions.job_dispatch"):
            lost = jobs_submit_many(kind="demo.noop", inputs=[{}] * 10)
        pending = Job.objects.filter(status=S.PENDING).count()
        assert pending == 2010 and job_messages() <= 2001, job_messages()

        sent = []
        for _ in range(4):  # several graces pass: every job is "stale"
            time.sleep(grace + 0.2)
            sent.append(jobs_redispatch_stale(grace=grace))
            in_broker = job_messages()
            queued = Job.objects.filter(status__in=[S.PENDING, S.PROCESSING]).count()
            assert in_broker <= queued + 2, (in_broker, queued, sent)
        assert sum(sent) == 10, sent  # the lost ones, once each
        assert job_messages() == 2011
        resent = Job.objects.filter(pk__in=[job.pk for job in lost], updated_at__gt=lost[0].created_at)
        assert resent.count() == 10
    finally:
        worker.kill()
        forget_every_message()


@pytest.mark.django_db
def test_a_broker_that_lost_its_data_gets_every_pending_message_at_once(django_capture_on_commit_callbacks):
    jobs_redispatch_stale(grace=120)  # the broker is known
    with django_capture_on_commit_callbacks(execute=True):
        jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * 3)
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(updated_at=timezone.now() - timedelta(seconds=5))
    assert jobs_redispatch_stale(grace=120) == 0  # their messages are only slow
    forget_every_message()  # Redis restarted empty: the messages are gone
    with mock.patch("jobs.services.transitions.job_dispatch") as dispatch:
        assert jobs_redispatch_stale(grace=120) == 3  # at once, not after the grace
    assert {call.kwargs["job"].pk for call in dispatch.call_args_list} == {job.pk for job in jobs}


def held_by_workers() -> dict[str, list[str]]:
    """What each worker process last published as held: {holder: [job ids]}."""
    client = broker()
    try:
        return {holder.decode(): json.loads(raw)["jobs"] for holder, raw in client.hgetall(held_key()).items()}
    finally:
        client.close()


def queued_runs_of(job_id) -> list[str | None]:
    """The `jobs.run` messages for `job_id` waiting in the `jobs` queue: the ETA of each."""
    client = broker()
    try:
        messages = [json.loads(raw) for raw in client.lrange(f"{settings.REDIS_KEY_PREFIX}jobs", 0, -1)]
    finally:
        client.close()
    return [message["headers"].get("eta") for message in messages if message["headers"]["task"] == "jobs.run"
            and json.loads(base64.b64decode(message["body"]))[0] == [str(job_id)]]


def hold_a_countdown_message(job: Job, worker, client: redis.Redis) -> None:
    """Put `job` in its back-off with its message (a countdown) as the only one, start `worker`,
    and wait until it published that it holds it (on its timer until it is due)."""
    client.delete(f"{settings.REDIS_KEY_PREFIX}jobs")
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() + timedelta(seconds=120))
    transitions.job_dispatch(job=Job.objects.get(pk=job.pk), countdown=120)
    worker.start()
    wait_until(lambda: [str(job.pk)] in held_by_workers().values(), timeout=30,
               message="the worker did not publish the countdown message it holds")


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_message_held_by_a_killed_worker_is_sent_again_once_the_worker_is_seen_dead(only_own_workers, settings):
    """The broker keeps nothing of a message a worker took (no acknowledgement emulation): a
    worker killed while it holds one (here a back-off's countdown, on its timer) took it along.
    It had published that it held it; once it stops publishing, the reconciler sends the job
    again, with the countdown left, even while other messages are queued."""
    grace = settings.JOBS_DISPATCH_GRACE = 1.0
    settings.JOBS_HELD_STALE_AFTER = 2.0
    forget_every_message()
    jobs_redispatch_stale(grace=grace)  # the broker is known: no "lost its data" pass below
    job, _ = job_submit(kind="demo.noop", input={})  # committed: its message and mark go out
    client = broker()
    worker = celery_worker(name="holder", concurrency=1)
    try:
        hold_a_countdown_message(job, worker, client)
        assert queued_runs_of(job.pk) == []
        assert held_messages() == 1  # what /metrics reports as delivered and not acknowledged
        # Due by the database, nothing queued, but held by a live worker: on its way, not lost.
        Job.objects.filter(pk=job.pk).update(updated_at=timezone.now() - timedelta(seconds=5),
                                             run_after=timezone.now() - timedelta(seconds=5))
        assert jobs_redispatch_stale(grace=grace) == 0
        Job.objects.filter(pk=job.pk).update(run_after=timezone.now() + timedelta(seconds=120))
        worker.kill()  # died holding it; the broker has no copy
        other, _ = job_submit(kind="demo.noop", input={})  # queued: the queue is not empty
        assert jobs_redispatch_stale(grace=grace) == 0  # not yet seen dead
        time.sleep(settings.JOBS_HELD_STALE_AFTER + 0.2)
        assert jobs_redispatch_stale(grace=grace) == 1  # its worker is dead: sent again at once
        assert jobs_redispatch_stale(grace=grace) == 0  # once
        assert held_by_workers() == {} and held_messages() == 0  # the dead worker's record is gone
        assert len(queued_runs_of(other.pk)) == 1
        resent = queued_runs_of(job.pk)
        assert len(resent) == 1 and resent[0], resent  # with the countdown left
    finally:
        worker.kill()
        client.close()
        forget_every_message()


@pytest.mark.django_db(transaction=True)
def test_a_message_a_live_worker_holds_unclaimed_past_the_grace_is_sent_once_more(settings):
    """A live worker claims a job as soon as it runs its message; one it holds unclaimed for a
    grace (a due countdown behind busy pool processes) is sent once more, so another worker may
    start it."""
    grace = settings.JOBS_DISPATCH_GRACE = 1.0
    forget_every_message()
    jobs_redispatch_stale(grace=grace)
    job, _ = job_submit(kind="demo.noop", input={})
    client = broker()
    try:
        client.delete(f"{settings.REDIS_KEY_PREFIX}jobs")  # taken by a worker that holds it
        held_publish("busy@host/1/0", [str(job.pk)])
        Job.objects.filter(pk=job.pk).update(updated_at=timezone.now() - timedelta(seconds=5))
        with mock.patch("jobs.services.transitions.job_dispatch"):
            assert jobs_redispatch_stale(grace=grace) == 0  # first seen held
        time.sleep(grace + 0.2)
        held_publish("busy@host/1/0", [str(job.pk)])  # still live, still holding it
        with mock.patch("jobs.services.transitions.job_dispatch") as dispatch:
            assert jobs_redispatch_stale(grace=grace) == 1
        assert dispatch.call_args.kwargs["job"].pk == job.pk
    finally:
        client.close()
        forget_every_message()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_shuts_down_cleanly_gives_its_held_messages_back(only_own_workers, settings):
    """A warm shutdown puts the messages a worker held and had not started back in the queue
    (kombu's, without acknowledgement emulation too) and removes its record: nothing to resend."""
    settings.JOBS_DISPATCH_GRACE = 1.0
    forget_every_message()
    jobs_redispatch_stale(grace=1.0)
    job, _ = job_submit(kind="demo.noop", input={})
    client = broker()
    worker = celery_worker(name="clean", concurrency=1)
    try:
        hold_a_countdown_message(job, worker, client)
        worker.stop()
        assert held_by_workers() == {}
        back = queued_runs_of(job.pk)
        assert len(back) == 1 and back[0], back
    finally:
        worker.kill()
        client.close()
        forget_every_message()


def test_a_publisher_that_cannot_reach_redis_says_so_once_and_publishes_when_it_can(monkeypatch, caplog):
    """Redis away: the publisher tries again every few seconds, not at every tick (a failing
    attempt holds the worker's event loop through the client's retries), logs one warning for the
    outage, and publishes as soon as Redis answers."""
    from jobs import broker as broker_module
    from jobs.tasks import HeldPublisher

    forget_every_message()
    publisher = HeldPublisher("outage@host/1/0", timer=mock.Mock(_queue=[]))
    # Nothing listens there; no retries of its own, to keep the test short.
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        with monkeypatch.context() as patch, caplog.at_level(logging.INFO, logger="jobs.tasks"):
            patch.setattr(broker_module, "_client", lambda: unreachable)
            publisher.tick()
            assert publisher.retry_at > time.monotonic()
            publisher.tick()  # too soon to try again: no attempt, no wait
            publisher.retry_at = 0.0  # the retry's time came
            publisher.tick()
        warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
        assert len(warnings) == 1 and "could not publish" in warnings[0].getMessage()
        assert held_by_workers() == {}
        publisher.retry_at = 0.0
        publisher.tick()  # Redis answers again
        assert held_by_workers() == {"outage@host/1/0": []}
        assert "published again" in caplog.records[-1].getMessage()
    finally:
        unreachable.close()
        forget_every_message()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_worker_of_another_pool_publishes_what_it_holds_too(only_own_workers, pool):
    """`make run` ships prefork; a worker started with `-P threads` or `-P solo` runs its timer
    otherwise (a thread of its own), and publishes what it holds all the same."""
    forget_every_message()
    jobs_redispatch_stale(grace=1.0)
    job, _ = job_submit(kind="demo.noop", input={})
    client = broker()
    worker = celery_worker(name=f"pool-{pool}", concurrency=2, extra_args=["--pool", pool])  # the last --pool wins
    try:
        hold_a_countdown_message(job, worker, client)
        worker.wait_for_output(f"concurrency: 2 ({'thread' if pool == 'threads' else pool})", timeout=10)
        worker.stop()
        assert held_by_workers() == {}
    finally:
        worker.kill()
        client.close()
        forget_every_message()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_message_lost_between_the_queue_and_the_worker_is_sent_again_once_nothing_is_queued(
    only_own_workers, settings
):
    """A worker killed after taking a message from the queue and before recording it as
    delivered loses it outright: it is in no queue and in no worker's hands, but its mark says it
    is on its way. With nothing queued, the reconciler sees that no one holds it."""
    grace = settings.JOBS_DISPATCH_GRACE = 1.0
    forget_every_message()
    jobs_redispatch_stale(grace=grace)  # the broker is known
    job, _ = job_submit(kind="demo.noop", input={})  # committed: its message and mark go out
    other, _ = job_submit(kind="demo.noop", input={})
    queue = f"{settings.REDIS_KEY_PREFIX}jobs"
    client = broker()
    try:
        assert client.llen(queue) == 2
        client.rpop(queue)  # the older message: taken, then the worker died
        Job.objects.filter(pk__in=[job.pk, other.pk]).update(updated_at=timezone.now() - timedelta(seconds=5))
        with mock.patch("jobs.services.transitions.job_dispatch"):
            assert jobs_redispatch_stale(grace=grace) == 0  # a message is still queued: maybe slow, not lost
        client.delete(queue)  # the other one was taken and lost too
        with mock.patch("jobs.services.transitions.job_dispatch") as dispatch:
            assert jobs_redispatch_stale(grace=grace) == 2
        assert {call.kwargs["job"].pk for call in dispatch.call_args_list} == {job.pk, other.pk}
    finally:
        client.close()
        forget_every_message()


@contextlib.contextmanager
def producers_of_apply_async():
    """The producer of each `jobs.run` message sent through Celery's `apply_async`, in order."""
    from jobs.tasks import job_run

    producers = []
    real = job_run.apply_async

    def recording(*args, **kwargs):
        producers.append(kwargs.get("producer"))
        return real(*args, **kwargs)

    with mock.patch.object(job_run, "apply_async", side_effect=recording):
        yield producers


@pytest.mark.django_db
def test_a_batchs_messages_go_out_from_templates_and_each_reaches_the_broker(django_capture_on_commit_callbacks):
    forget_every_message()
    with producers_of_apply_async() as through_celery:
        with django_capture_on_commit_callbacks(execute=True):
            jobs_submit_many(kind="demo.noop", inputs=[{}] * 5)
    # At most one: the template's capture, which pushes nothing itself (tests/test_run_messages.py).
    assert len(through_celery) <= 1
    assert job_messages() == 5
    # A single submit's message goes out on its own.
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(kind="demo.noop", input={})
    assert job_messages() == 6


@pytest.mark.django_db
def test_a_batch_of_messages_celery_must_send_goes_through_one_producer(django_capture_on_commit_callbacks):
    forget_every_message()
    with mock.patch("jobs.services.transitions.run_message_render", return_value=None), \
            producers_of_apply_async() as producers:
        with django_capture_on_commit_callbacks(execute=True):
            jobs_submit_many(kind="demo.noop", inputs=[{}] * 5)
    assert len(producers) == 5 and producers[0] is not None
    assert all(producer is producers[0] for producer in producers), "a producer per message"
    assert job_messages() == 5


@pytest.mark.django_db
def test_a_batchs_messages_reach_the_broker_together_when_the_batch_ends(django_capture_on_commit_callbacks):
    """kombu's publish batch: one pipeline for the batch's messages, not a round trip each."""
    forget_every_message()
    from jobs.services import transitions

    seen_while_sending = []
    real = transitions.job_dispatch

    def counting(**kwargs):
        real(**kwargs)
        seen_while_sending.append(job_messages())

    with mock.patch("jobs.services.transitions.job_dispatch", side_effect=counting):
        with django_capture_on_commit_callbacks(execute=True):
            jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * 5)
    assert seen_while_sending == [0] * 5
    assert job_messages() == 5
    # Each job's lasting mark, written once the batch went out.
    client = broker()
    try:
        ttls = [client.ttl(mark_key(job.pk)) for job in jobs]
    finally:
        client.close()
    assert all(ttl > settings.JOBS_DISPATCH_MARK_TTL - 10 for ttl in ttls), ttls


@pytest.mark.django_db
@pytest.mark.parametrize("sent_events", [False, True])
def test_a_batch_asks_celerys_configuration_once_and_each_message_follows_it(
    django_capture_on_commit_callbacks, monkeypatch, sent_events
):
    """Whether a message may be sent from its template (`jobs.broker.direct_allowed`) is asked
    once a batch, and the answer holds for each of its messages: with Flower's task-sent events
    on (WORKER_TASK_EVENTS=true), every one goes through Celery."""
    from jobs.tasks import job_run

    forget_every_message()
    asked, allowed = [], []
    real_allowed, real_render = transitions.direct_allowed, transitions.run_message_render
    monkeypatch.setattr(transitions, "direct_allowed", lambda task: asked.append(task) or real_allowed(task))

    def render(task, job_id, options, **kwargs):
        allowed.append(kwargs.get("allowed"))
        return real_render(task, job_id, options, **kwargs)

    monkeypatch.setattr(transitions, "run_message_render", render)
    with django_capture_on_commit_callbacks(execute=True):
        jobs_submit_many(kind="demo.noop", inputs=[{}])  # the message's template made (through Celery)
    del asked[:], allowed[:]
    task, before = job_run._get_current_object(), job_run.app.conf.task_send_sent_event
    job_run.app.conf.task_send_sent_event = sent_events
    try:
        with mock.patch.object(task, "apply_async", wraps=task.apply_async) as through_celery:
            with django_capture_on_commit_callbacks(execute=True):
                jobs_submit_many(kind="demo.noop", inputs=[{}] * 5)
    finally:
        job_run.app.conf.task_send_sent_event = before
    assert len(asked) == 1 and allowed == [not sent_events] * 5
    assert through_celery.call_count == (5 if sent_events else 0)
    assert job_messages() == 6


@pytest.mark.django_db
@pytest.mark.parametrize("through", ["templates", "celery"])
def test_a_batch_that_does_not_reach_the_broker_leaves_its_jobs_to_the_reconciler(
    django_capture_on_commit_callbacks, settings, caplog, through
):
    from kombu.exceptions import BatchPublishError

    forget_every_message()
    jobs_redispatch_stale(grace=120)  # the broker is known (its epoch is set)
    settings.JOBS_DISPATCH_GRACE = 0.5
    with contextlib.ExitStack() as failing:
        if through == "templates":
            failing.enter_context(mock.patch("jobs.broker.RedisChannel.conn_or_acquire",
                                             side_effect=redis.ConnectionError("Redis went away")))
            failing.enter_context(mock.patch("jobs.services.transitions.run_message_render",
                                             side_effect=lambda task, job_id, options, **_: ("jobs", job_id)))
        else:
            failing.enter_context(mock.patch("jobs.services.transitions.run_message_render", return_value=None))
            failed = BatchPublishError("Redis publish batch failed; delivery is uncertain")
            failing.enter_context(mock.patch("kombu.transport.redis.PublishBatch.flush", side_effect=failed))
        with django_capture_on_commit_callbacks(execute=True):
            jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * 3)
    assert job_messages() == 0
    assert "their messages may not have reached the broker" in caplog.text
    # Only the early marks: no lasting mark says that the messages are on their way.
    client = broker()
    try:
        assert all(0 < client.pttl(mark_key(job.pk)) <= 1000 * (0.5 + 3 * 0.02) for job in jobs)
    finally:
        client.close()
    time.sleep(0.7)
    assert jobs_redispatch_stale(grace=0.5) == 3
    assert job_messages() == 3


@pytest.mark.django_db
def test_a_batch_without_a_producer_sends_each_message_on_its_own(django_capture_on_commit_callbacks):
    forget_every_message()
    with mock.patch("jobs.services.transitions._pooled_producer", side_effect=OSError("pool exhausted")):
        with django_capture_on_commit_callbacks(execute=True):
            jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * 3)
    assert job_messages() == 3
    assert all(Job.objects.get(pk=job.pk).status == S.PENDING for job in jobs)
