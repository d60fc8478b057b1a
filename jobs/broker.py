"""What the platform knows of its messages in the broker (Redis), so that the reconciler re-sends
a lost message and never a slow one.

- **Dispatch marks.** Each job's dispatch leaves a mark in the broker's own Redis (expiring after
  JOBS_DISPATCH_MARK_TTL): a job with a mark has a message on its way; one without had its
  message lost (never published: a crash between the commit and the publish; or gone with the
  broker's data). The marks live and die with the messages they vouch for.
- **Message count.** The `jobs.run` messages waiting in the job queues plus those the workers hold:
  the reconciler never lets it grow past the jobs that need one.
- **Held messages.** Celery's Redis transport runs without its acknowledgement emulation (the
  `unacked` hash, a MULTI/EXEC at each delivery and each ack: a sixth of a job's CPU, bench/README.md):
  a message a worker took is gone from Redis. Each worker's main process instead publishes which
  jobs' messages it holds (running, reserved, or waiting on its timer for a countdown) under its own
  field of one hash, when that changes and at least every few seconds (`held_publish`, from
  `jobs.tasks`), with Redis's time. The field of a worker that stopped publishing for
  JOBS_HELD_STALE_AFTER seconds (killed, its host lost) names the messages that died with it: the
  reconciler sends those jobs again at once, when still `pending` (`dispatch_stranded`). A worker
  shutting down cleanly gives its unstarted messages back to the queue (kombu) and removes its
  field. A message taken and not yet published (the first JOBS_HELD_PUBLISH_INTERVAL of its hold,
  before a live worker claims its job in a few milliseconds) is covered by the rule below and by
  its mark's expiry. A job whose message a live worker has held unclaimed for more than the
  dispatch grace (a due countdown behind busy pool processes) is sent once more, so that another
  worker may start it.
- **Lost on the way.** With no message queued at all, a marked job whose message no worker holds
  has lost it (a worker killed between taking it and publishing it).
- **The broker's epoch.** A key that only the reconciler writes: when it is gone, Redis lost its
  data (restarted empty, flushed), so every pending job's message is gone too and is re-sent at
  once rather than after the dispatch grace. Redis's `run_id` is kept in it for the logs.

Every function here is best effort: with Redis away it logs and answers as if nothing were known.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import redis
from celery import signals
from django.conf import settings
from kombu.transport.redis import Channel as RedisChannel

from jobs.redis_clients import redis_client

logger = logging.getLogger(__name__)

_clients: dict[int, redis.Redis] = {}


def _client() -> redis.Redis:
    """This process's client of the broker's Redis (a new one after a fork)."""
    client = _clients.get(os.getpid())
    if client is None:
        # Through the Sentinels when REDIS_URL names them: `redis.Redis.from_url` refuses a
        # `sentinel://` URL, and every mark and every reconciler pass failed with it.
        client = redis_client(socket_timeout=2, socket_connect_timeout=2)
        _clients.clear()
        _clients[os.getpid()] = client
    return client


def _options() -> dict[str, Any]:
    return settings.CELERY_BROKER_TRANSPORT_OPTIONS


def _prefix() -> str:
    return _options().get("global_keyprefix", "")


def _mark_name(job_id: Any) -> str:
    return f"jobs:sent:{job_id}"


def mark_key(job_id: Any) -> str:
    return f"{_prefix()}{_mark_name(job_id)}"


# Marks held back to be written together (`dispatch_marks_together`), per thread.
_held_marks = threading.local()


def _mark_ttl(countdown: float | None) -> int:
    return max(int(settings.JOBS_DISPATCH_MARK_TTL + (countdown or 0)), 1)


def dispatch_marks_held() -> bool:
    """Whether this thread holds its dispatch marks back (`dispatch_marks_together`)."""
    return getattr(_held_marks, "marks", None) is not None


def dispatch_mark(job_id: Any, *, countdown: float | None = None) -> None:
    """Record that `job_id`'s message was just published (it is on its way, maybe delayed by
    `countdown` seconds). A message pushed from its template takes its mark along instead
    (`run_message_send`'s `mark`): the same round trip."""
    ttl = _mark_ttl(countdown)
    held = getattr(_held_marks, "marks", None)
    if held is not None:
        held.append((job_id, ttl))
        return
    try:
        _client().set(mark_key(job_id), "1", ex=ttl)
    except redis.RedisError as exc:
        logger.warning("could not mark the dispatch of job %s: %s", job_id, exc)


@contextmanager
def dispatch_marks_together() -> Iterator[None]:
    """Inside, the dispatch marks are held and written in one pipeline at the end: a batch's
    messages cost one round trip each instead of two. Use it only where the jobs already carry an
    early mark (`dispatch_premark`) that covers them until then. When the block raises (its
    messages may not have gone out) none is written: the early marks expire, and the reconciler
    sends the jobs again."""
    held = _held_marks.marks = []
    try:
        yield
    except BaseException:
        held.clear()
        raise
    finally:
        _held_marks.marks = None
        if held:
            try:
                with _client().pipeline(transaction=False) as pipe:
                    for job_id, ttl in held:
                        pipe.set(mark_key(job_id), "1", ex=ttl)
                    pipe.execute()
            except redis.RedisError as exc:
                logger.warning("could not mark the dispatch of %d jobs: %s", len(held), exc)


# A batch is published one message at a time after its commit: this long per job, at most.
BATCH_PUBLISH_SECONDS_PER_JOB = 0.02


def dispatch_premark(job_ids: list[Any]) -> None:
    """Mark a batch's jobs as on their way before its transaction commits: its messages are
    published one by one after the commit, which for a large batch takes longer than the
    dispatch grace, and the reconciler must not take the jobs still waiting their turn for lost
    ones. The marks last the grace plus a generous publishing time per job; each job's own
    dispatch then marks it for good. A batch whose process dies before publishing everything
    is re-sent once these expire."""
    if not job_ids:
        return
    ttl_ms = int(1000 * (settings.JOBS_DISPATCH_GRACE + BATCH_PUBLISH_SECONDS_PER_JOB * len(job_ids)))
    try:
        with _client().pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.set(mark_key(job_id), "1", px=ttl_ms)
            pipe.execute()
    except redis.RedisError as exc:
        logger.warning("could not mark a batch of %d jobs as on their way: %s", len(job_ids), exc)


def dispatch_forget(job_id: Any) -> None:
    """`job_id`'s message was consumed without the job being claimed or sent again (the worker
    gave up on it): nothing is on its way any more."""
    try:
        _client().delete(mark_key(job_id))
    except redis.RedisError as exc:
        logger.warning("could not clear the dispatch mark of job %s: %s", job_id, exc)


def dispatch_marked(job_ids: Iterable[Any]) -> set[Any]:
    """Which of `job_ids` have a message on its way (a dispatch mark)."""
    ids = list(job_ids)
    if not ids:
        return set()
    with _client().pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.exists(mark_key(job_id))
        found = pipe.execute()
    return {job_id for job_id, exists in zip(ids, found, strict=True) if exists}


def job_queues() -> list[str]:
    """The queues jobs' messages go to: the default one and every queue a kind asks for."""
    from jobs.registry import kinds_all

    return sorted({settings.CELERY_TASK_DEFAULT_QUEUE} | {kind.queue for kind in kinds_all() if kind.queue})


def job_messages(*, delivered: bool = True) -> int:
    """`jobs.run` messages in the broker: waiting in the job queues (every priority step), plus
    (with `delivered`) those the live workers hold (running, reserved, or held for a countdown),
    as they last published them."""
    options = _options()
    prefix = _prefix()
    steps = options.get("priority_steps", RedisChannel.priority_steps)
    sep = options.get("sep", RedisChannel.sep)
    with _client().pipeline(transaction=False) as pipe:
        for name in job_queues():
            for step in steps:
                pipe.llen(f"{prefix}{name}{sep}{step}" if step else f"{prefix}{name}")
        if delivered:
            pipe.hgetall(held_key())
            pipe.time()
        results = pipe.execute()
    if not delivered:
        return sum(results)
    *lengths, records, (seconds, micros) = results
    return sum(lengths) + _live_count(records, now=seconds + micros / 1e6)


# --- What each worker holds ---------------------------------------------------------------------

def held_key() -> str:
    return f"{_prefix()}jobs:held"


# HSET field ARGV[1] of KEYS[1] to {"jobs": ARGV[2] (a JSON list), "at": Redis's time}: one round trip.
_HELD_PUBLISH = """
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], string.format('{"at": %d.%06d, "jobs": %s}', now[1], now[2], ARGV[2]))
"""


def held_publish(holder: str, job_ids: Iterable[str]) -> None:
    """Record that the worker process `holder` (a name of its own: its node name, pid and start)
    holds the messages of `job_ids` now. Raises redis.RedisError when Redis did not take it: the
    caller tries again at its next tick, and says so once, not every second of an outage."""
    _client().eval(_HELD_PUBLISH, 1, held_key(), holder, json.dumps(sorted(job_ids)))


def held_forget(*holders: str) -> None:
    """Remove `holders`' records: a worker shutting down cleanly (its unstarted messages are back
    in the queue), or a dead one whose messages the reconciler sent again."""
    if not holders:
        return
    try:
        _client().hdel(held_key(), *holders)
    except redis.RedisError as exc:
        logger.warning("could not remove the held messages of %s: %s", ", ".join(holders), exc)


class Holding(NamedTuple):
    holder: str
    jobs: frozenset[str]
    live: bool  # published within JOBS_HELD_STALE_AFTER


def _holdings(records: dict[bytes, bytes], *, now: float) -> list[Holding]:
    stale_after = settings.JOBS_HELD_STALE_AFTER
    holdings = []
    for raw_holder, raw in records.items():
        holder = raw_holder.decode()
        try:
            record = json.loads(raw)
            jobs, at = frozenset(str(job_id) for job_id in record["jobs"]), float(record["at"])
        except (ValueError, KeyError, TypeError):
            logger.warning("unreadable record of held messages for %s: dropped", holder)
            jobs, at = frozenset(), float("-inf")
        holdings.append(Holding(holder, jobs, now - at <= stale_after))
    return holdings


def _live_count(records: dict[bytes, bytes], *, now: float) -> int:
    return sum(len(holding.jobs) for holding in _holdings(records, now=now) if holding.live)


def held_messages() -> int:
    """`jobs.run` messages the live workers hold (running, reserved, or held for a countdown), as
    they last published them."""
    with _client().pipeline(transaction=False) as pipe:
        pipe.hgetall(held_key())
        pipe.time()
        records, (seconds, micros) = pipe.execute()
    return _live_count(records, now=seconds + micros / 1e6)


class Held(NamedTuple):
    """What `dispatch_stranded` found."""

    held: set[str]  # jobs whose message a live worker holds
    stranded: set[str]  # among them, those held unclaimed for longer than `after`
    orphaned: set[str]  # jobs whose message a dead worker held (and no live one holds)
    dead: list[str]  # the holders that stopped publishing: `held_forget` them once their jobs are sent


def dispatch_stranded(*, after: float) -> Held:
    """The jobs whose `jobs.run` message a live worker holds now, and among them those held for
    more than `after` seconds, counted from the first pass that saw them held (Redis's clock); and
    the jobs whose message a dead worker held (it stopped publishing: `held_publish`), with the
    dead holders.

    A live worker claims a job the moment its message arrives, so a `pending` job whose message
    has been held that long waits behind busy pool processes (a due countdown): it is sent once
    more, which only lets another worker start it (the old message finds the job taken and is
    dropped). A dead worker's messages are gone with it: the broker never gives them back.

    Call it from one place at a time (the reconciler's pass holds its lock)."""
    client = _client()
    seen_key = f"{_prefix()}jobs:held-seen"
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(held_key())
        pipe.hgetall(seen_key)
        pipe.time()
        records, seen_raw, (seconds, micros) = pipe.execute()
    now = seconds + micros / 1e6
    holdings = _holdings(records, now=now)
    held = {job_id for holding in holdings if holding.live for job_id in holding.jobs}
    dead = [holding for holding in holdings if not holding.live]
    seen = {job_id.decode(): float(value) for job_id, value in seen_raw.items()}
    new = {job_id: now for job_id in held if job_id not in seen}
    gone = [job_id for job_id in seen if job_id not in held]
    if new or gone:
        with client.pipeline(transaction=False) as pipe:
            if new:
                pipe.hset(seen_key, mapping=new)
            if gone:
                pipe.hdel(seen_key, *gone)
            pipe.execute()
    stranded = {job_id for job_id in held if job_id in seen and now - seen[job_id] > after}
    orphaned = {job_id for holding in dead for job_id in holding.jobs} - held
    return Held(held, stranded, orphaned, [holding.holder for holding in dead])


def broker_lost_its_data() -> bool:
    """Did the broker lose its data since the last look (Redis restarted empty, or was flushed)?
    True also at the very first look, when nothing is known (which costs at most one duplicate
    message per pending job, once)."""
    client = _client()
    run_id = client.info("server").get("run_id", "")
    key = f"{_prefix()}jobs:broker-epoch"
    if client.set(key, run_id, nx=True):
        return True
    known = client.get(key)
    if known is not None and known.decode() != run_id:
        logger.info("the broker restarted with its data (run id %s, was %s)", run_id, known.decode())
        client.set(key, run_id)
    return False


# --- A job's message, published without Celery's per-message work ------------------------------
#
# `Task.apply_async` spends about 0.35 ms of CPU per message here (routing, the exec options, the
# protocol-2 headers, `saferepr` of the arguments, kombu's producer and exchange lookup): a tenth
# of a web process's CPU per `POST /api/jobs/` (bench/README.md). Every `jobs.run` message with
# the same queue, shadow name and time limits differs only in its ids, so the first one of each
# such shape in a process is built by Celery itself and taken from kombu's channel at the last
# step before Redis, as a template. That message and the next ones are the template with their
# own ids, pushed onto the same key with the client kombu would use (its key prefix, its
# Sentinels); a batch's go in one round trip. Anything that could make a message differ from
# the template sends it through Celery instead (`direct_allowed`).

# Placeholders for the ids of a captured message (no two share a substring).
_TEMPLATE_TASK_ID = "5ea7ba5e-0000-4000-8000-000000000001"
_TEMPLATE_TAG = "5ea7ba5e-0000-4000-8000-000000000002"
_TEMPLATE_JOB_ID = "5ea7ba5e-0000-4000-8000-000000000003"


class _Template:
    """A captured `jobs.run` message: the JSON text with placeholders for its ids, and the body
    (base64 of JSON) with a placeholder for the job's id."""

    __slots__ = ("channel_key", "text", "body", "body_b64")

    def __init__(self, channel_key: str, message: dict[str, Any]) -> None:
        self.channel_key = channel_key
        self.body = base64.b64decode(message["body"]).decode()
        self.body_b64 = message["body"]
        self.text = json.dumps(message)

    def render(self, job_id: str, task_id: str, tag: str) -> str:
        body = base64.b64encode(self.body.replace(_TEMPLATE_JOB_ID, job_id).encode()).decode()
        return (self.text.replace(self.body_b64, body).replace(_TEMPLATE_TASK_ID, task_id)
                .replace(_TEMPLATE_TAG, tag).replace(_TEMPLATE_JOB_ID, job_id))


_templates: dict[tuple, _Template | None] = {}


def direct_allowed(task: Any) -> bool:
    """Whether a `task` message may be sent from a template: not in eager mode, not with Flower's
    task-sent events on, not from inside a worker's task (Celery then names the parent and root
    task in the message), and with nobody listening to Celery's publish signals (a tracer that
    adds its headers to each message)."""
    app = task.app
    conf = app.conf
    return not (conf.task_always_eager or conf.task_send_sent_event or app.current_worker_task is not None
                or signals.before_task_publish.receivers or signals.after_task_publish.receivers)


def _captured(task: Any, producer: Any, options: dict[str, Any]) -> _Template | None:
    """Have Celery build and publish a message with placeholder ids, and take it from kombu's
    channel at the last step, instead of pushing it to Redis; None when this transport's messages
    cannot be templated (not kombu's Redis, a queue with an expiry, a body not in base64)."""
    channel = producer.channel
    if not isinstance(channel, RedisChannel):
        return None
    seen: list[tuple[str, dict[str, Any]]] = []
    channel._put = lambda queue, message, **kwargs: seen.append((queue, message))
    try:
        task.apply_async(args=[_TEMPLATE_JOB_ID], task_id=_TEMPLATE_TASK_ID, producer=producer, **options)
    finally:
        del channel._put
    if len(seen) != 1:
        return None
    queue, message = seen[0]
    properties = message.get("properties", {})
    if properties.get("body_encoding") != "base64" or queue in (channel._expires or {}):
        return None
    properties["delivery_tag"] = _TEMPLATE_TAG
    key = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
    return _Template(key, message)


def run_message_render(task: Any, job_id: str, options: dict[str, Any],
                       allowed: bool | None = None) -> tuple[str, str] | None:
    """The Redis key and the text of the `task` message (`jobs.run`) that runs `job_id` with these
    `apply_async` options (the shadow name, the queue, the time limits), as Celery would have
    pushed it; None when Celery must send it itself (see `direct_allowed`; a countdown is
    Celery's). `allowed`: `direct_allowed(task)` as the caller found it for a batch of messages
    (each asks Celery's configuration twice: a sixth of a batch's dispatch)."""
    if "countdown" in options or "producer" in options:
        return None
    if not (direct_allowed(task) if allowed is None else allowed):
        return None
    shape = (os.getpid(), task.name, tuple(sorted(options.items())))
    template = _templates.get(shape, False)
    if template is False:
        with task.app.producer_or_acquire() as producer:
            template = _templates[shape] = _captured(task, producer, options)
    if template is None:
        return None
    return template.channel_key, template.render(job_id, str(uuid.uuid4()), str(uuid.uuid4()))


def run_message_send(task: Any, job_id: str, options: dict[str, Any], *, mark: bool = False) -> bool:
    """Push the message `run_message_render` gives; False, having sent nothing, when Celery
    must send it itself. With `mark`, the job's dispatch mark (`dispatch_mark`) goes in the same
    round trip, after the message. Redis runs both even when it refuses the first, so a refused
    message has its mark taken back (`dispatch_forget`) before the error is raised: no mark
    vouches for it. A mark Redis refused is logged, as `dispatch_mark` does (the reconciler then
    sends the job once more after the dispatch grace)."""
    message = run_message_render(task, job_id, options)
    if message is None:
        return False
    if not mark:
        run_messages_push(task, [message])
        return True
    with task.app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        with client.pipeline(transaction=False) as pipe:
            pipe.lpush(*message)
            # kombu's client puts its key prefix on SET as on LPUSH: the key is `mark_key`'s.
            pipe.set(_mark_name(job_id), "1", ex=_mark_ttl(None))
            pushed, marked = pipe.execute(raise_on_error=False)
    if isinstance(pushed, Exception):
        dispatch_forget(job_id)
        raise pushed
    if isinstance(marked, Exception):
        logger.warning("could not mark the dispatch of job %s: %s", job_id, marked)
    return True


def run_messages_push(task: Any, messages: list[tuple[str, str]]) -> None:
    """Push rendered messages, in order, with kombu's client of `task`'s broker: one LPUSH per
    key and thousand messages, all in one round trip."""
    with task.app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        if len(messages) == 1:
            client.lpush(*messages[0])
            return
        by_key: dict[str, list[str]] = {}
        for key, text in messages:
            by_key.setdefault(key, []).append(text)
        with client.pipeline(transaction=False) as pipe:
            for key, texts in by_key.items():
                for start in range(0, len(texts), 1000):
                    pipe.lpush(key, *texts[start:start + 1000])
            pipe.execute()
