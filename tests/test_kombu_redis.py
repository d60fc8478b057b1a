"""kombu's Redis transport with one client per channel (taskplatform/kombu_redis.py), against the
real Redis: publishing and the worker's bookkeeping build no client per command, a pool kombu
replaced gets a client of its own, and the broker keeps its usual name for Flower and the logs."""

from __future__ import annotations

from unittest import mock

import kombu.transport
import pytest
import redis
from django.conf import settings

from jobs.models import Job
from jobs.services import job_submit
from taskplatform import kombu_redis
from taskplatform.celery import app
from tests.support.processes import celery_worker, wait_until


def broker_scheme() -> str:
    """The broker URL's scheme, as kombu and Flower spell it: `redis` or `rediss` over TCP,
    `redis+socket` on a Unix socket (the embedded Redis, without REDIS_URL)."""
    scheme = settings.CELERY_BROKER_URL.split("://", 1)[0]
    assert scheme in ("redis", "rediss", "redis+socket"), settings.CELERY_BROKER_URL
    return scheme


def test_the_broker_is_kombus_redis_transport_under_its_own_name():
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, kombu_redis.Transport)
        assert isinstance(connection.default_channel, kombu_redis.Channel)
        # Flower picks its broker page by the URL's scheme.
        assert connection.as_uri().startswith(f"{broker_scheme()}://")
    assert kombu.transport.TRANSPORT_ALIASES["sentinel"] == "taskplatform.kombu_redis:SentinelTransport"
    kombu_redis.install()  # again: nothing changes
    assert kombu.transport.resolve_transport("redis") is kombu_redis.Transport


def test_publishing_builds_no_client_per_message():
    built = mock.Mock(wraps=redis.Redis.__init__)
    with app.connection_for_write() as connection, app.producer_or_acquire() as producer:
        channel = connection.default_channel
        first = channel._create_client()
        with mock.patch.object(redis.Redis, "__init__", lambda self, *a, **kw: built(self, *a, **kw)):
            for number in range(5):
                producer.publish({"n": number}, exchange="", routing_key=f"{settings.REDIS_KEY_PREFIX}kombu-test",
                                 declare=[], serializer="json")
            with channel.conn_or_acquire() as client:
                assert client is first
    assert built.call_count == 0


def test_a_replaced_pool_gets_a_client_of_its_own():
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        before = channel._create_client()
        assert channel._create_client() is before
        channel._disconnect_pools()  # what kombu does after a lost connection
        after = channel._create_client()
        assert after is not before
        assert after.connection_pool is channel.pool
        assert after.ping()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_runs_jobs_through_it_and_names_its_broker_redis():
    worker = celery_worker(name="kombu-redis", concurrency=1).start()
    try:
        ids = [job_submit(kind="demo.noop", input={})[0].pk for _ in range(3)]
        wait_until(lambda: Job.objects.filter(pk__in=ids, status=Job.Status.COMPLETED).count() == 3,
                   timeout=30, message="the worker did not complete the jobs")
        assert f"transport:   {broker_scheme()}://" in worker.output
    finally:
        worker.stop()
