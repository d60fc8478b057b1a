"""A job's message sent from a template (`jobs.broker.run_message_send`) is Celery's own message
with other ids: compared key for key with what `apply_async` pushes, on the real Redis, for each
shape of options; and Celery sends it itself wherever a template could differ."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from celery import signals

from jobs import broker
from jobs.tasks import job_run
from taskplatform.celery import app


@pytest.fixture
def queue():
    """A queue of this test's own on the real broker: no worker of the suite takes from it."""
    name = f"direct-{uuid.uuid4().hex[:8]}"  # kombu's client adds the suite's key prefix
    yield name
    with app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        client.delete(name)


def pushed(queue: str) -> list[dict]:
    """The messages on `queue`, oldest first (taken off it, as a worker takes them)."""
    with app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        return [json.loads(raw) for raw in iter(lambda: client.rpop(queue), None)]


def normalised(message: dict, job_id: str) -> dict:
    """`message` with its own ids replaced by names, and its body decoded."""
    text = json.dumps(message)
    task_id, tag = message["headers"]["id"], message["properties"]["delivery_tag"]
    message = json.loads(text.replace(task_id, "TASK").replace(tag, "TAG").replace(job_id, "JOB"))
    message["body"] = json.loads(base64.b64decode(message["body"]).decode().replace(job_id, "JOB"))
    return message


@pytest.mark.parametrize("extra", [
    {},
    {"soft_time_limit": 30, "time_limit": 90},
], ids=["plain", "time limits"])
def test_the_template_gives_celerys_own_message(queue, extra):
    options = {"shadow": f"test.kind-{uuid.uuid4().hex[:6]}", "queue": queue, **extra}
    first, second, by_celery = (str(uuid.uuid4()) for _ in range(3))

    assert broker.run_message_send(job_run, first, options)  # captured, then sent from the template
    assert broker.run_message_send(job_run, second, options)  # from the template alone
    job_run.apply_async(args=[by_celery], **options)

    messages = pushed(queue)
    assert len(messages) == 3
    ours = [normalised(m, job_id) for m, job_id in zip(messages, (first, second, by_celery), strict=True)]
    assert ours[0] == ours[2] and ours[1] == ours[2]
    assert ours[2]["body"][0] == ["JOB"] and ours[2]["headers"]["shadow"] == options["shadow"]
    # Every message has ids of its own.
    assert len({m["headers"]["id"] for m in messages}) == 3
    assert len({m["properties"]["delivery_tag"] for m in messages}) == 3
    assert all(m["headers"]["root_id"] == m["headers"]["id"] == m["properties"]["correlation_id"]
               for m in messages)


def test_a_countdown_or_a_batch_producer_is_celerys(queue):
    assert not broker.run_message_send(job_run, str(uuid.uuid4()), {"queue": queue, "countdown": 5})
    assert not broker.run_message_send(job_run, str(uuid.uuid4()), {"queue": queue, "producer": object()})
    assert pushed(queue) == []


def test_a_listener_of_celerys_publish_signal_gets_every_message_through_celery(queue):
    seen = []

    def listener(sender=None, headers=None, **kwargs):
        seen.append(headers["id"])

    signals.before_task_publish.connect(listener, weak=False)
    try:
        assert not broker.run_message_send(job_run, str(uuid.uuid4()), {"queue": queue})
    finally:
        signals.before_task_publish.disconnect(listener)
    assert pushed(queue) == []


def test_flowers_task_sent_events_are_celerys(queue):
    before = app.conf.task_send_sent_event
    app.conf.task_send_sent_event = True  # WORKER_TASK_EVENTS=true
    try:
        assert not broker.run_message_send(job_run, str(uuid.uuid4()), {"queue": queue})
    finally:
        app.conf.task_send_sent_event = before


def test_inside_a_workers_task_celery_names_the_parent(queue, monkeypatch):
    monkeypatch.setattr(type(app), "current_worker_task", property(lambda self: object()))
    assert not broker.run_message_send(job_run, str(uuid.uuid4()), {"queue": queue})


def round_trips(monkeypatch) -> list[bytes]:
    """Every write of commands to a Redis socket from now on (a pipeline is one)."""
    from redis.connection import AbstractConnection

    writes: list[bytes] = []
    send = AbstractConnection.send_packed_command

    def counting(self, command, *args, **kwargs):
        writes.append(command)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return writes


def test_a_message_takes_its_dispatch_mark_along_in_the_same_round_trip(queue, monkeypatch, settings):
    options = {"queue": queue}
    broker.run_message_send(job_run, str(uuid.uuid4()), options)  # the template is captured first
    job_id = str(uuid.uuid4())
    writes = round_trips(monkeypatch)
    assert broker.run_message_send(job_run, job_id, options, mark=True)
    assert len(writes) == 1, writes
    monkeypatch.undo()
    assert [normalised(m, job_id)["body"][0] for m in pushed(queue)[1:]] == [["JOB"]]
    # Under kombu's key prefix as the reconciler reads it (the suite's settings have one).
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    assert broker.dispatch_marked([job_id]) == {job_id}
    ttl = settings.JOBS_DISPATCH_MARK_TTL
    assert ttl - 2 <= broker._client().ttl(broker.mark_key(job_id)) <= ttl


def test_a_mark_redis_refuses_is_logged_and_the_message_still_goes(queue, monkeypatch, caplog):
    monkeypatch.setattr(broker, "_mark_ttl", lambda countdown: -1)  # SET … EX -1: Redis refuses it
    job_id = str(uuid.uuid4())
    assert broker.run_message_send(job_run, job_id, {"queue": queue}, mark=True)
    assert len(pushed(queue)) == 1
    assert broker.dispatch_marked([job_id]) == set()
    assert f"could not mark the dispatch of job {job_id}" in caplog.text


@pytest.mark.django_db
def test_a_dispatch_from_a_template_writes_its_mark_with_the_message(monkeypatch):
    from jobs.models import Job
    from jobs.services import transitions

    job = Job.objects.create(kind="demo.noop", input={})
    transitions.job_dispatch(job=job)  # the template of this shape, if this process has none yet
    broker._client().delete(broker.mark_key(job.pk))
    monkeypatch.setattr(transitions, "dispatch_mark", lambda *args, **kwargs: pytest.fail("a second round trip"))
    transitions.job_dispatch(job=job)
    assert broker.dispatch_marked([job.pk]) == {job.pk}


def test_a_message_redis_refuses_leaves_no_mark_vouching_for_it(queue):
    import redis

    options = {"queue": queue}
    broker.run_message_send(job_run, str(uuid.uuid4()), options)  # the template is captured first
    pushed(queue)
    with app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        client.set(queue, "not a list")  # LPUSH onto it: WRONGTYPE, and Redis still runs the SET after it
    job_id = str(uuid.uuid4())
    try:
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            broker.run_message_send(job_run, job_id, options, mark=True)
    finally:
        with app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
            client.delete(queue)
    assert broker.dispatch_marked([job_id]) == set()
