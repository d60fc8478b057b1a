"""GET /readyz: the database, Redis and the workers' heartbeats, with real worker processes (the
scheduler's heartbeat: test_scheduler.py)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from jobs.models import Job
from jobs.services import job_submit
from ops.workers import last_job_key, redis_client, worker_heartbeat, workers_key
from tests.support.processes import celery_worker, wait_until

pytestmark = pytest.mark.django_db


PROBE_TOKEN = "readiness-probe-token"


@pytest.fixture(autouse=True)
def probe_token(settings):
    """The detail of /readyz is for staff and the METRICS_TOKEN (tests/security/test_health_detail.py)."""
    settings.METRICS_TOKEN = PROBE_TOKEN


def readyz(client) -> tuple[int, dict]:
    response = client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer {PROBE_TOKEN}")
    return response.status_code, response.json()


@pytest.fixture
def own_prefix(settings):
    """A Redis key prefix no worker of this test run writes under: a deployment without workers."""
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}readyz-{uuid.uuid4().hex[:8]}:"
    yield settings.REDIS_KEY_PREFIX
    redis_client().delete(workers_key(), last_job_key())


def test_without_any_worker_it_is_503_naming_the_missing_workers(client, own_prefix):
    status, body = readyz(client)
    assert status == 503
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok" and body["checks"]["redis"] == "ok"
    assert body["checks"]["workers"].startswith("error: no worker consuming the queue 'jobs' wrote a heartbeat")
    assert body["workers"] == []
    # (The depth is the test run's real queue, which other tests' messages may be passing through.)
    assert {"name": "jobs", "workers": 0} in [{"name": q["name"], "workers": q["workers"]} for q in body["queues"]]


def test_a_worker_seen_too_long_ago_does_not_make_it_ready(client, own_prefix, settings, scheduler_beating):
    settings.OPS_WORKER_STALE_AFTER = 30
    worker_heartbeat(hostname="old@host", queues=["jobs"], started_at=time.time() - 600)
    record = json.loads(redis_client().hget(workers_key(), "old@host"))
    redis_client().hset(workers_key(), "old@host", json.dumps({**record, "seen_at": time.time() - 31}))
    status, body = readyz(client)
    assert status == 503
    [worker] = body["workers"]
    assert worker["hostname"] == "old@host" and worker["fresh"] is False and worker["seen_seconds_ago"] >= 31
    assert worker["last_job_seconds_ago"] is None

    worker_heartbeat(hostname="new@host", queues=["jobs", "reports"], started_at=time.time())
    status, body = readyz(client)
    assert status == 200 and body["status"] == "ready"
    assert body["checks"]["workers"] == "ok: 1 seen in the last 30 s, 1 consuming 'jobs'"
    assert {"name": "reports", "depth": 0, "workers": 1} in body["queues"]


def test_a_fresh_worker_of_another_queue_alone_runs_no_job_so_it_is_not_ready(client, own_prefix):
    worker_heartbeat(hostname="platform@host", queues=["platform"], started_at=time.time())
    status, body = readyz(client)
    assert status == 503
    assert body["checks"]["workers"].startswith("error: no worker consuming the queue 'jobs'")
    assert body["workers"][0]["fresh"] is True
    assert {"name": "platform", "depth": 0, "workers": 1} in body["queues"]


def test_redis_down_is_503_naming_redis(client, settings, tmp_path):
    settings.REDIS_URL = f"unix://{tmp_path}/nothing-listens-here.sock"
    status, body = readyz(client)
    assert status == 503
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("error")
    assert body["checks"]["workers"].startswith("error")


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_live_worker_reports_its_queues_and_when_it_last_took_a_job(client, worker, scheduler_beating):
    status, body = readyz(client)
    assert status == 200, body
    consumers = [w for w in body["workers"] if w["fresh"] and "jobs" in w["queues"]]
    assert consumers, body
    assert next(q for q in body["queues"] if q["name"] == "jobs")["workers"] >= 1

    job, _ = job_submit(kind="demo.noop", input={})
    wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.COMPLETED, timeout=30)
    status, body = readyz(client)
    ran = [w for w in body["workers"] if w["hostname"] in {c["hostname"] for c in consumers}]
    assert min(w["last_job_seconds_ago"] for w in ran if w["last_job_seconds_ago"] is not None) < 10, body
    assert all(w["last_job_at"] for w in ran if w["last_job_seconds_ago"] is not None)


@pytest.mark.worker
def test_a_worker_names_its_own_queue_and_leaves_when_it_stops(client):
    queue = f"readyz-{uuid.uuid4().hex[:6]}"
    process = celery_worker(name=queue, queues=queue, concurrency=1).start()
    try:
        _, body = readyz(client)
        [mine] = [w for w in body["workers"] if w["hostname"].startswith(f"{queue}-")]
        assert mine["queues"] == [queue] and mine["fresh"] and mine["seen_seconds_ago"] < 10
        assert mine["last_job_seconds_ago"] is None  # it has taken nothing yet
        assert {"name": queue, "depth": 0, "workers": 1} in body["queues"]
    finally:
        process.stop()

    def gone() -> bool:
        return not [w for w in readyz(client)[1]["workers"] if w["hostname"].startswith(f"{queue}-")]

    wait_until(gone, timeout=10, message="a worker that shut down cleanly is still listed")
