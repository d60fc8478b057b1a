"""A simulated generation service, shipped for the `demo.generate` kind, the tests and the tour.

It plays an outside service that takes a while (an LLM generation, say) and is served by this
same Django app under `/sim/`, so any web process can answer. Its state lives in Redis, not in
the platform's database: it stands for somebody else's system (and it keeps the callback URL,
token included, which the platform itself never stores).

    POST /sim/generate/        {"prompt", "delay", "drop_callback"?, "throttle"?, "callback_url"?}
                               header Idempotency-Key (required): the same key, the same generation
                               202 {"id"}
    GET  /sim/generate/{id}/   200 {"id", "status": "running" | "succeeded", "progress", "text"?}

With `throttle` N, the first N calls for a generation (submits and checks together) answer 429
with `Retry-After: 1`. `delay` seconds after the submit the generation is done and the service
POSTs to `callback_url` (never, with `drop_callback`). Due callbacks sit in a Redis sorted set:
a short countdown task sends each on time, and beat's sweep sends any whose task was lost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from functools import cache
from typing import Any

import httpx
import redis
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from jobs.redis_clients import redis_client

logger = logging.getLogger(__name__)

TTL = 24 * 3600  # seconds a generation is remembered
# Delays up to this many seconds also get a countdown task (short ETA messages are harmless; the
# visibility timeout is an hour). Longer ones rely on beat's sweep alone.
COUNTDOWN_MAX = 60.0


@cache
def _redis() -> redis.Redis:
    return redis_client(decode_responses=True)


def _key(*parts: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}sim:" + ":".join(parts)


def _throttled(idem: str, throttle: int) -> JsonResponse | None:
    calls = _redis().incr(_key("calls", idem))
    _redis().expire(_key("calls", idem), TTL)
    if calls <= throttle:
        response = JsonResponse({"detail": f"throttled ({calls} of {throttle})"}, status=429)
        response["Retry-After"] = "1"
        return response
    return None


@csrf_exempt
@require_POST
def generation_submit(request: HttpRequest) -> JsonResponse:
    """Start a generation (or return the one started with the same Idempotency-Key)."""
    key = request.headers.get("Idempotency-Key", "")
    try:
        body = json.loads(request.body or b"{}")
        delay = float(body.get("delay", 0))
        throttle = int(body.get("throttle") or 0)
    except (ValueError, TypeError):
        return JsonResponse({"detail": "the body must be JSON with a numeric delay"}, status=400)
    if not key:
        return JsonResponse({"detail": "the Idempotency-Key header is required"}, status=400)
    idem = hashlib.sha256(key.encode()).hexdigest()
    if (response := _throttled(idem, throttle)) is not None:
        return response
    client = _redis()
    gen_id = uuid.uuid4().hex
    if not client.set(_key("idem", idem), gen_id, nx=True, ex=TTL):
        return JsonResponse({"id": client.get(_key("idem", idem))}, status=202)
    now = time.time()
    callback_url = str(body.get("callback_url") or "")
    drop = bool(body.get("drop_callback"))
    client.hset(_key("gen", gen_id), mapping={
        "prompt": str(body.get("prompt", "")), "delay": delay, "created": now, "idem": idem, "throttle": throttle,
        "callback_url": callback_url, "drop_callback": int(drop), "status_calls": 0, "callbacks_sent": 0,
    })
    client.expire(_key("gen", gen_id), TTL)
    if callback_url and not drop:
        client.zadd(_key("callbacks"), {gen_id: now + delay})
        if delay <= COUNTDOWN_MAX:
            from demo.tasks import simulator_callback

            simulator_callback.apply_async(args=[gen_id], countdown=delay)
    return JsonResponse({"id": gen_id}, status=202)


@require_GET
def generation_status(request: HttpRequest, gen_id: str) -> JsonResponse:
    """How a generation is doing."""
    gen = generation_get(gen_id)
    if gen is None:
        return JsonResponse({"detail": "no such generation"}, status=404)
    if (response := _throttled(gen["idem"], int(gen["throttle"]))) is not None:
        return response
    _redis().hincrby(_key("gen", gen_id), "status_calls", 1)
    delay, elapsed = float(gen["delay"]), time.time() - float(gen["created"])
    if elapsed < delay:
        return JsonResponse({"id": gen_id, "status": "running", "progress": round(elapsed / delay, 3)})
    return JsonResponse({"id": gen_id, "status": "succeeded", "progress": 1.0, "text": generated_text(gen["prompt"])})


def generated_text(prompt: str) -> str:
    """What the simulated model "writes" for `prompt`."""
    return f"A generated answer to: {prompt}"


def generation_get(gen_id: str) -> dict[str, Any] | None:
    """The stored state of a generation (for tests and benchmarks), or None."""
    gen = _redis().hgetall(_key("gen", gen_id))
    return gen or None


def callback_send(gen_id: str) -> bool:
    """POST to the generation's callback URL now, if it is still due (claimed once, by removal
    from the sorted set). Returns whether this call sent it."""
    client = _redis()
    if not client.zrem(_key("callbacks"), gen_id):
        return False  # sent by someone else, or never due
    url = client.hget(_key("gen", gen_id), "callback_url")
    if not url:
        return False
    client.hincrby(_key("gen", gen_id), "callbacks_sent", 1)
    try:
        response = httpx.post(url, timeout=settings.WAITS_HTTP_TIMEOUT)
        logger.info("simulator: callback of %s answered %s", gen_id, response.status_code)
    except httpx.HTTPError as exc:  # a lost callback: the platform's backup checks cover it
        logger.warning("simulator: callback of %s failed: %s", gen_id, exc)
    return True


def callback_send_if_due(gen_id: str) -> bool:
    """The countdown task's body: send the callback if its time has come."""
    score = _redis().zscore(_key("callbacks"), gen_id)
    if score is None or score > time.time() + 0.05:
        return False
    return callback_send(gen_id)


def callbacks_send_due(limit: int = 100) -> int:
    """Beat's sweep: send every callback whose time has come (one whose countdown task was lost)."""
    due = _redis().zrangebyscore(_key("callbacks"), "-inf", time.time(), start=0, num=limit)
    return sum(callback_send(gen_id) for gen_id in due)


urlpatterns = [
    path("generate/", generation_submit, name="sim-generate"),
    path("generate/<str:gen_id>/", generation_status, name="sim-generate-status"),
]
