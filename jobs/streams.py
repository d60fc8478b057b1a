"""The live streams of one server process: the per-user cap, the re-checks, the lost pushes.

Every websocket on `/ws/jobs/…` and every SSE stream registers here once it is authorised
(`LiveStreams.admit`) and leaves when it ends (`release`). One registry per event loop, so per
web process, runs the periodic work for all of them, so no stream polls on its own:

- **The cap.** A user may hold `LIVE_STREAMS_PER_USER` streams at once, counted in Redis so the
  cap holds across web processes (a sorted set per user; each entry is leased and renewed at
  every re-check, so the entries of a process that died expire by themselves). Over the cap the
  stream is refused (websocket close 4429, SSE 429).
- **The re-check.** A stream is authorised when it opens; every `LIVE_RECHECK_INTERVAL` seconds
  the registry checks again, in a few queries for all its streams, that each user is still
  active, each credential (the API token behind a ticket or an SSE request, or the session) is
  still valid, and each job still visible. A stream that fails is closed: 4401 (authenticate
  again) for the credential or the user, 4403 for the job. A revoked token is not left to the
  next re-check: `credential_revoked_publish` pushes the revocation to every web process, which
  closes that token's streams at once.
- **Lost pushes.** Every `resync_interval` seconds it reads the newest seq of every job its
  streams follow, in one query, and has the streams still behind what was committed at the
  previous look catch up from the database (a push lost at the end of a burst, which no later
  event reveals): within two intervals.

How a credential is checked is the business of the app that issued it: `accounts.credentials`
(`token`, `session`), which also signals a revocation.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import defaultdict
from typing import Any, Protocol

import redis.asyncio as aioredis
from django.conf import settings
from django.contrib.auth import get_user_model
from redis.exceptions import RedisError

from accounts.credentials import credentials_still_valid
from dbkit.threads import off_request_thread
from jobs.broadcast import publish
from jobs.fanout import LocalFanout, Push
from jobs.models import Job
from jobs.redis_clients import async_redis_client
from jobs.selectors import jobs_visible_to

logger = logging.getLogger(__name__)

CREDENTIALS_GROUP = "live.credentials"
REVOKED = 4401  # the credential or the user is no longer valid: authenticate again
REFUSED = 4403  # may not see the job (the contract's close code)
OVER_CAP = 4429  # too many live streams for this user

Credential = tuple[str, str]  # (kind, id): ("token", "<ApiToken pk>"), ("session", "<session key>")


def credential_revoked_publish(*, kind: str, id: Any, **_: Any) -> None:
    """Tell every web process that a credential was revoked: its live streams close at once.
    The receiver of `accounts.credentials.credential_revoked` (connected by `JobsConfig.ready`),
    which is sent after the revocation committed."""
    publish(CREDENTIALS_GROUP, {"type": "credential.revoked", "credential": [kind, str(id)]})


class Stream(Protocol):
    """What the registry needs of a live stream (a websocket consumer, an SSE stream)."""

    stream_id: str
    user: Any
    credential: Credential | None
    job_pk: Any  # None for the feed of all jobs
    last_seq: int
    finished: bool

    def resync(self) -> None:
        """Catch up from the database (a push may have been lost)."""

    def end(self, code: int, reason: str) -> None:
        """Close the stream now, without waiting (`code`: a websocket close code)."""


# Sorted set per user: member = stream id, score = lease expiry (Redis' clock, so the web
# processes' clocks need not agree).
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1)
return 1
"""
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('EXPIRE', key, math.ceil(tonumber(ARGV[1])) + 1)
end
return #KEYS
"""


def _cap_key(user_pk: Any) -> str:
    return f"{settings.REDIS_KEY_PREFIX}live:streams:{user_pk}"


def _lease_seconds() -> float:
    return 3 * settings.LIVE_RECHECK_INTERVAL + 5


class LiveStreams:
    """The registry of one event loop (so of one web process); see the module docstring."""

    resync_interval = 5.0  # seconds between two looks for lost pushes
    # Redis commands of the registry in flight at once: a crowd connecting together waits for a
    # slot instead of asking the client's pool (100 connections) for more than it has.
    redis_concurrency = 20
    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}
        self.tasks: list[asyncio.Task] = []
        self.redis: aioredis.Redis | None = None
        self.redis_slots = asyncio.Semaphore(self.redis_concurrency)
        self.following = False
        # Releases under way: the loop keeps only a weak reference to a task, so one nobody
        # holds may be collected before it has given the place back.
        self.releasing: set[asyncio.Task] = set()

    @classmethod
    def here(cls) -> LiveStreams:
        loop = asyncio.get_running_loop()
        streams = cls._by_loop.get(loop)
        if streams is None:
            streams = cls._by_loop[loop] = cls()
        return streams

    def _client(self) -> aioredis.Redis:
        if self.redis is None:
            self.redis = async_redis_client(socket_timeout=2, socket_connect_timeout=2)
        return self.redis

    async def admit(self, stream: Stream) -> str | None:
        """Count `stream` against its user's cap and look after it from now on; returns the
        refusal (a sentence for the client) when the user holds too many streams already."""
        cap = settings.LIVE_STREAMS_PER_USER
        if cap:
            try:
                async with self.redis_slots:
                    taken = await self._client().eval(_ADMIT, 1, _cap_key(stream.user.pk), stream.stream_id,
                                                      cap, _lease_seconds())
            except RedisError as exc:  # Redis away: no pushes either; let the stream read the database
                logger.warning("live stream cap not checked (Redis: %s: %s)", type(exc).__name__, exc)
                taken = 1
            if not taken:
                return (f"too many live streams for this user: at most {cap} at once "
                        "(close another one, or wait for one to end)")
        self.streams[stream.stream_id] = stream
        if not self.tasks:
            self.tasks = [asyncio.ensure_future(self._resync_forever()), asyncio.ensure_future(self._recheck_forever())]
        if not self.following:
            self.following = True
            try:
                await LocalFanout.here().follow(CREDENTIALS_GROUP, self)
            except Exception as exc:  # revocations then wait for the next re-check
                self.following = False
                logger.warning("could not follow revocations: %s: %s", type(exc).__name__, exc)
        return None

    def release(self, stream: Stream) -> None:
        """Forget `stream` (it ended) and give its place under the cap back."""
        if self.streams.pop(stream.stream_id, None) is None or not settings.LIVE_STREAMS_PER_USER:
            return
        task = asyncio.ensure_future(self._cap_release(stream.user.pk, stream.stream_id))
        self.releasing.add(task)
        task.add_done_callback(self.releasing.discard)

    async def released(self) -> None:
        """Wait for the releases under way (for a caller about to stop the loop, and tests)."""
        while self.releasing:
            await asyncio.wait(set(self.releasing))

    async def _cap_release(self, user_pk: Any, stream_id: str) -> None:
        try:
            async with self.redis_slots:
                await self._client().zrem(_cap_key(user_pk), stream_id)
        except RedisError:  # the lease runs out by itself
            pass

    def end(self, stream: Stream, code: int, reason: str) -> None:
        """Close `stream` (refused from now on) and forget it."""
        self.release(stream)
        try:
            stream.end(code, reason)
        except Exception:
            logger.exception("could not close a live stream")

    # -- revocations, pushed ------------------------------------------------------------------
    def deliver(self, push: Push) -> None:
        message = push.message
        if message.get("type") != "credential.revoked":
            return
        credential = tuple(message["credential"])
        for stream in list(self.streams.values()):
            if stream.credential == credential:
                self.end(stream, REVOKED, "the credential of this stream was revoked: authenticate again")

    # -- the periodic re-check -----------------------------------------------------------------
    async def _recheck_forever(self) -> None:
        while True:
            await asyncio.sleep(settings.LIVE_RECHECK_INTERVAL)
            if not self.streams:
                continue
            try:
                await self.recheck()
            except Exception:  # a database or Redis hiccup: the next round checks again
                logger.warning("live streams: re-check failed", exc_info=True)

    async def recheck(self) -> None:
        """Check every stream's user, credential and job again; close those that fail."""
        streams = list(self.streams.values())
        verdicts, users = await _verdicts(streams)
        for stream in streams:
            verdict = verdicts.get(stream.stream_id)
            if verdict is not None:
                self.end(stream, *verdict)
            elif stream.stream_id in self.streams:
                stream.user = users[stream.user.pk]  # staff or not, as of now
        await self._cap_renew()

    async def _cap_renew(self) -> None:
        streams = list(self.streams.values())
        if not streams or not settings.LIVE_STREAMS_PER_USER:
            return
        try:
            for start in range(0, len(streams), 500):
                part = streams[start:start + 500]
                async with self.redis_slots:
                    await self._client().eval(_RENEW, len(part), *[_cap_key(s.user.pk) for s in part],
                                              _lease_seconds(), *[s.stream_id for s in part])
        except RedisError as exc:
            logger.warning("live stream leases not renewed (Redis: %s: %s)", type(exc).__name__, exc)

    # -- lost pushes ---------------------------------------------------------------------------
    async def _resync_forever(self) -> None:
        tick = 0
        previous: dict[Any, int] = {}  # job pk -> its newest seq at the last look
        while True:
            await asyncio.sleep(self.resync_interval)
            tick += 1
            # A finished job can only move again by a retry: look at those 6 times less often.
            due = [s for s in list(self.streams.values())
                   if s.job_pk is not None and (not s.finished or tick % 6 == 0)]
            if not due:
                previous = {}
                continue
            try:
                newest = await _newest_seqs(list({s.job_pk for s in due}))
            except Exception:  # a database hiccup: try again at the next tick
                logger.warning("lost-push check failed", exc_info=True)
                continue
            # Behind what was committed a whole interval ago: that push is lost, not on its way.
            # (Comparing with what was committed just now would send every stream of a busy job,
            # whose newest push is still in flight, to the database at each tick.)
            for stream in due:
                if previous.get(stream.job_pk, 0) > stream.last_seq:
                    stream.resync()
            followed = {s.job_pk for s in self.streams.values()}
            previous = {**{pk: seq for pk, seq in previous.items() if pk in followed}, **newest}


@off_request_thread
def _newest_seqs(job_pks: list[Any]) -> dict[Any, int]:
    newest: dict[Any, int] = {}
    for start in range(0, len(job_pks), 500):
        newest.update(Job.objects.filter(pk__in=job_pks[start:start + 500]).values_list("pk", "event_seq"))
    return newest


@off_request_thread
def _verdicts(streams: list[Stream]) -> tuple[dict[str, tuple[int, str]], dict[Any, Any]]:
    """For each stream that must end, (close code, reason); and the users as they are now."""
    users = {user.pk: user for user in get_user_model().objects.filter(pk__in={s.user.pk for s in streams})}
    ids_by_kind: defaultdict[str, set[str]] = defaultdict(set)
    for stream in streams:
        if stream.credential is not None:
            ids_by_kind[stream.credential[0]].add(stream.credential[1])
    valid = {kind: credentials_still_valid(kind, ids) for kind, ids in ids_by_kind.items()}
    jobs_by_user: defaultdict[Any, set] = defaultdict(set)
    for stream in streams:
        user = users.get(stream.user.pk)
        if stream.job_pk is not None and user is not None and user.is_active and not user.is_staff:
            jobs_by_user[user.pk].add(stream.job_pk)
    visible = {pk: set(jobs_visible_to(users[pk], per_row=True).filter(pk__in=job_pks).values_list("pk", flat=True))
               for pk, job_pks in jobs_by_user.items()}
    verdicts: dict[str, tuple[int, str]] = {}
    for stream in streams:
        user = users.get(stream.user.pk)
        if user is None or not user.is_active:
            verdicts[stream.stream_id] = (REVOKED, "the user was deactivated")
        elif stream.credential is not None and stream.credential[1] not in valid[stream.credential[0]]:
            verdicts[stream.stream_id] = (REVOKED, "the credential of this stream is no longer valid: "
                                                   "authenticate again")
        elif user.pk in visible and stream.job_pk not in visible[user.pk]:
            verdicts[stream.stream_id] = (REFUSED, "you may no longer see this job")
    return verdicts, users
