"""Redis with Sentinel (issue 17, point 3): the master is killed with jobs in flight and websocket
clients connected. Every Redis client of the platform (the Celery broker through kombu's Sentinel
transport, the channel layer, the cache, the platform's own clients) finds the promoted replica
through the Sentinels. Every job completes, no finished step runs again, and every client
receives every event (a client whose socket dropped reconnects with `after`, as live.js does).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from jobs.redis_clients import async_redis_client, redis_client
from tests.chaos.servers import JobFollower, Platform, SentinelCluster
from tests.chaos.test_restarts import ENV, assert_gapless, assert_sleep_ran_once
from tests.support.processes import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.worker]

PREFIX = "sentinel:"


@pytest.fixture
def sentinel_cluster(tmp_path):
    cluster = SentinelCluster(tmp_path / "redis").start()
    yield cluster
    cluster.stop()


def test_a_platform_client_follows_the_master_through_the_sentinels(sentinel_cluster):
    """The unit under the rest: a client made from a sentinel:// URL writes to the master, and
    to the promoted replica after the master dies."""
    client = redis_client(sentinel_cluster.url, socket_timeout=1, socket_connect_timeout=1)
    client.set("before", "1")
    # Replication is asynchronous: the kill must not beat the write to the replica.
    assert client.execute_command("WAIT", 1, 5000) == 1
    sentinel_cluster.kill_master()
    wait_until(lambda: sentinel_cluster.master_address() == ("127.0.0.1", sentinel_cluster.replica.port),
               timeout=30, message="the Sentinels did not promote the replica")

    def written() -> bool:
        try:
            return bool(client.set("after", "1"))
        except redis.RedisError:
            return False

    wait_until(written, timeout=15, message="the client did not follow the new master")
    assert client.get("before") == b"1"  # replicated before the kill

    async def asyncio_client_on_the_new_master() -> bool:
        # The registry of live streams' client (jobs.streams), made after the failover.
        client = async_redis_client(sentinel_cluster.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(await client.set("async", "1")) and await client.get("before") == b"1"
        finally:
            await client.aclose()

    assert asyncio.run(asyncio_client_on_the_new_master())


def test_the_dispatch_marks_and_the_reconcilers_reads_go_through_the_sentinels(sentinel_cluster, settings,
                                                                              monkeypatch):
    """`jobs.broker`'s own client: with a sentinel:// REDIS_URL every mark and every reconciler
    pass failed (`redis.Redis.from_url` refuses the scheme), so a message lost in a failover
    was never sent again."""
    from jobs import broker

    settings.REDIS_URL = sentinel_cluster.url
    monkeypatch.setattr(broker, "_clients", {})
    job_id = uuid.uuid4()
    broker.dispatch_mark(job_id)
    assert broker.dispatch_marked([job_id, uuid.uuid4()]) == {job_id}
    assert broker.job_messages() == 0
    broker.broker_lost_its_data()  # reads and writes the broker's epoch: no error
    assert broker._client().connection_pool.__class__.__name__ == "SentinelConnectionPool"


def test_a_batch_of_messages_reaches_the_master_through_the_sentinels(sentinel_cluster):
    """A batch's messages (`jobs.services.transitions.dispatch_batch`: kombu's publish batch, one
    pipeline) through kombu's Sentinel transport, as the platform configures it: none is in the
    queue before the batch ends, all of them after, under the key prefix."""
    from celery import Celery

    from taskplatform.redis_urls import broker_transport_options_for, redis_url_for_celery

    app = Celery("batch-through-the-sentinels", set_as_current=False)
    app.conf.broker_url = redis_url_for_celery(sentinel_cluster.url)
    app.conf.broker_transport_options = {**broker_transport_options_for(sentinel_cluster.url),
                                         "global_keyprefix": PREFIX, "socket_timeout": 5}
    client = redis_client(sentinel_cluster.url, socket_timeout=1, socket_connect_timeout=1)
    with app.producer_or_acquire() as producer:
        assert producer.supports_batch_publish
        with producer.batch():
            for n in range(5):
                app.send_task("batch.noop", args=[n], queue="batch", producer=producer)
            assert client.llen(f"{PREFIX}batch") == 0
    assert client.llen(f"{PREFIX}batch") == 5


def test_the_master_dies_with_jobs_in_flight_and_watchers_connected(sentinel_cluster, chaos_database, chaos_db,
                                                                   tmp_path):
    platform = Platform(database_url=chaos_database, redis_url=sentinel_cluster.url, workdir=tmp_path, env=ENV,
                        concurrency=2, prefix=PREFIX)
    try:
        platform.start()
        db = chaos_db
        # Two long jobs hold the pool through the failover; four short ones queue behind them.
        busy = [platform.submit("demo.sleep", {"seconds": seconds, "steps": seconds}) for seconds in (8, 5)]
        wait_until(lambda: set(db.statuses(busy).values()) == {"processing"}, timeout=20,
                   message=f"the long jobs did not start: {db.statuses(busy)}")
        followers = [JobFollower(platform.web_url, platform.api_token(), job_id, reconnect=True).start()
                     for job_id in busy]
        queued = [platform.submit("demo.sleep", {"seconds": 0.2, "steps": 2}) for _ in range(4)]
        time.sleep(1.0)

        sentinel_cluster.kill_master()
        killed_at = time.monotonic()
        wait_until(lambda: sentinel_cluster.master_address() == ("127.0.0.1", sentinel_cluster.replica.port),
                   timeout=30, message="the Sentinels did not promote the replica")
        promoted_in = time.monotonic() - killed_at

        # Submitted after the failover: the web server's broker connection found the new master.
        after = [platform.submit("demo.sleep", {"seconds": 0.1, "steps": 1}) for _ in range(2)]

        every = busy + queued + after
        first_finished: list[float] = []

        def all_done() -> bool:
            statuses = db.statuses(every)
            if not first_finished and "completed" in statuses.values():
                first_finished.append(time.monotonic() - killed_at)
            return len(statuses) == len(every) and set(statuses.values()) <= {"completed", "failed", "cancelled"}

        wait_until(all_done, timeout=90, interval=0.2,
                   message=f"not every job finished after the failover: {db.statuses(every)}")
        statuses = db.statuses(every)
        assert set(statuses.values()) == {"completed"}, statuses
        jobs = db.jobs(every)
        for job_id in every:
            assert_gapless(db, job_id, jobs[job_id]["event_seq"])
        for job_id, steps in zip(busy, (8, 5), strict=True):
            assert_sleep_ran_once(db, job_id, steps)
        for job_id in queued:
            assert_sleep_ran_once(db, job_id, 2)
        for follower, job_id in zip(followers, busy, strict=True):
            wait_until(follower.finished_at, timeout=20,
                       message=f"watcher of {job_id} missed the end: {follower.seqs()}, error {follower.error!r}")
            follower.stop()
            assert follower.seqs() == list(range(1, jobs[job_id]["event_seq"] + 1)), follower.seqs()
        for process in platform.processes:
            assert process.proc.poll() is None, f"{process.name} died:\n{process.output[-3000:]}"
        print(f"\nsentinel failover: replica promoted {promoted_in:.1f}s after the kill; first job finished "
              f"{first_finished[0]:.1f}s after it; all {len(every)} completed; watchers reconnected "
              f"{[f.connections - 1 for f in followers]} time(s)")
    finally:
        platform.stop()
