"""Per-token rate limits, counted in Redis (Django's cache) so they hold across processes."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.cache import cache
from redis.exceptions import RedisError
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from accounts.models import ApiToken

logger = logging.getLogger(__name__)


class TokenRateThrottle(SimpleRateThrottle):
    """At most N requests per period for each API token (each user, for a browser session).

    The rate is `REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["api"]` (env `API_THROTTLE_RATE`),
    read per request so a settings override takes effect. A fixed window counted with one
    atomic Redis INCR per request, instead of DRF's default list of timestamps that is read,
    edited and written back (racy across processes and heavy at high rates).
    """

    scope = "api"

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if isinstance(request.auth, ApiToken):
            ident = f"token:{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return f"throttle:{self.scope}:{ident}"

    def allow_request(self, request: Any, view: Any) -> bool:
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        now = time.time()
        window = int(now // self.duration)
        self.window_ends = (window + 1) * self.duration
        key = f"{key}:{window}"
        try:
            count = self._count(key)
        except RedisError as exc:
            # Redis down or restarting: a limit that cannot be counted lets the request through,
            # rather than refuse every submission while the database is fine.
            logger.warning("rate limit not checked (Redis unavailable): %s", exc)
            return True
        return count <= self.num_requests

    def _count(self, key: str) -> int:
        """This window's count after this request: one round trip (a pipeline that creates the
        key with its expiry if it is new, then adds one), atomic across processes."""
        redis_key = cache.make_and_validate_key(key)
        client = cache._cache.get_client(redis_key, write=True)
        with client.pipeline(transaction=False) as pipe:
            pipe.set(redis_key, 0, ex=int(self.duration) + 1, nx=True)
            pipe.incr(redis_key)
            return int(pipe.execute()[1])

    def wait(self) -> float:
        return max(self.window_ends - time.time(), 1.0)
