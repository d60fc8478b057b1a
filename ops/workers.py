"""What each Celery worker tells Redis about itself, for /readyz and /metrics.

Two hashes under REDIS_KEY_PREFIX, one field per worker (its Celery node name):

- `ops:workers`: `{"queues": [...], "pid", "started_at", "seen_at"}`, written by the worker's
  main process when it is ready and then every OPS_HEARTBEAT_INTERVAL seconds from its timer;
  removed when it shuts down cleanly. A killed worker's entry stays and ages.
- `ops:worker-last-job`: the time its pool last began running a job (a `jobs.run` task; beat's
  housekeeping tasks do not count), written by the pool process (`task_prerun`), at most once a
  second per process so a busy worker adds no Redis round trip per job.

Every time here is Redis's clock (`TIME`), the one the workers and the web servers that read
them share: a worker whose host clock is ahead would otherwise look fresh after it died, and one
behind would look stale while alive.

Two hashes, not one, so the main process and its pool processes never overwrite each other's
fields. Reading them is two commands, whatever the number of jobs: no `inspect()` broadcast,
which waits for every worker to answer and is slow on a busy two-core machine. Writes never
raise: a Redis hiccup costs a heartbeat, never a job.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import redis
from django.conf import settings

from jobs.redis_clients import redis_client as redis_client_for_url

logger = logging.getLogger(__name__)

# An entry older than this is removed when read: a worker that died long ago is no news.
FORGET_AFTER = 7 * 24 * 3600
# The pool's last-job write happens at most this often per process (seconds).
LAST_JOB_RESOLUTION = 1.0

_last_job_written: dict[str, float] = {}  # monotonic times, this process's own

# HSET the field ARGV[1] of KEYS[1] to Redis's time now: one round trip, Redis's clock.
_SET_TO_REDIS_TIME = """
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d.%06d', now[1], now[2]))
"""


def workers_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}ops:workers"


def last_job_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}ops:worker-last-job"


@lru_cache(maxsize=4)
def _client_for(url: str, pid: int) -> redis.Redis:
    # One connection pool per process and URL (the pid: a forked pool process opens its own).
    return redis_client_for_url(url, socket_timeout=2, socket_connect_timeout=2)


def redis_client() -> redis.Redis:
    """A Redis client on REDIS_URL (the broker's server) with short timeouts."""
    return _client_for(settings.REDIS_URL, os.getpid())


def redis_now(client: redis.Redis | None = None) -> float:
    """Redis's time now (Unix seconds): the clock of every time in these hashes."""
    seconds, microseconds = (client or redis_client()).time()
    return seconds + microseconds / 1e6


def worker_heartbeat(*, hostname: str, queues: list[str], started_at: float) -> None:
    """Record that the worker `hostname` is alive now and consumes `queues`."""
    try:
        client = redis_client()
        record = {"queues": sorted(queues), "pid": os.getpid(), "started_at": started_at,
                  "seen_at": redis_now(client)}
        client.hset(workers_key(), hostname, json.dumps(record))
    except redis.RedisError as exc:
        logger.warning("could not write the heartbeat of %s: %s", hostname, exc)


def worker_forget(*, hostname: str) -> None:
    """Remove the worker `hostname` (it is shutting down cleanly)."""
    try:
        client = redis_client()
        client.hdel(workers_key(), hostname)
        client.hdel(last_job_key(), hostname)
    except redis.RedisError as exc:
        logger.warning("could not remove the heartbeat of %s: %s", hostname, exc)


def worker_job_taken(*, hostname: str) -> None:
    """Record that the worker `hostname` began running a job now (at most once a second per process)."""
    now = time.monotonic()
    if hostname in _last_job_written and now - _last_job_written[hostname] < LAST_JOB_RESOLUTION:
        return
    _last_job_written[hostname] = now
    try:
        redis_client().eval(_SET_TO_REDIS_TIME, 1, last_job_key(), hostname)
    except redis.RedisError as exc:
        logger.warning("could not record the last job of %s: %s", hostname, exc)


@dataclass(frozen=True)
class WorkerSeen:
    hostname: str
    queues: list[str]
    pid: int | None
    started_at: float | None
    seen_at: float
    last_job_at: float | None

    def seen_ago(self, now: float) -> float:
        return max(now - self.seen_at, 0.0)

    def last_job_ago(self, now: float) -> float | None:
        return None if self.last_job_at is None else max(now - self.last_job_at, 0.0)

    def is_fresh(self, now: float) -> bool:
        return self.seen_ago(now) <= settings.OPS_WORKER_STALE_AFTER


def workers_seen(*, now: float | None = None) -> list[WorkerSeen]:
    """Every worker that wrote a heartbeat (fresh or not), by name. Raises redis.RedisError when
    Redis does not answer (the caller reports that as its check). `now`: Redis's (`redis_now`)."""
    client = redis_client()
    now = redis_now(client) if now is None else now
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(workers_key())
        pipe.hgetall(last_job_key())
        records, last_jobs = pipe.execute()
    seen, forgotten = [], []
    for raw_name, raw_record in records.items():
        hostname = raw_name.decode()
        record = _record(raw_record)
        if record is None or now - record["seen_at"] > FORGET_AFTER:
            forgotten.append(hostname)
            continue
        last_job = last_jobs.get(raw_name)
        seen.append(WorkerSeen(
            hostname=hostname, queues=list(record.get("queues") or []), pid=record.get("pid"),
            started_at=record.get("started_at"), seen_at=float(record["seen_at"]),
            last_job_at=float(last_job) if last_job is not None else None,
        ))
    if forgotten:
        client.hdel(workers_key(), *forgotten)
        client.hdel(last_job_key(), *forgotten)
    return sorted(seen, key=lambda worker: worker.hostname)


def _record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
        float(record["seen_at"])
    except (ValueError, KeyError, TypeError):
        return None
    return record
