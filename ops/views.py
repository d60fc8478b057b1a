"""`GET /metrics` (Prometheus, staff or METRICS_TOKEN), `GET /healthz` (liveness: the database and
Redis) and `GET /readyz` (readiness: and a worker for the default queue).

The two probes answer anyone, so that a load balancer or an orchestrator can use them, but only
with a status; the detail (each check, exception text, workers' hostnames and PIDs, queues) is
for staff and for the METRICS_TOKEN, the same callers as the metrics."""

from __future__ import annotations

import hmac
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_safe
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from jobs.redis_clients import redis_client
from ops.metrics import PlatformCollector, queue_depths, queue_names
from ops.scheduler import scheduler_check, scheduler_seen
from ops.workers import WorkerSeen, redis_now, workers_seen


def _refusal(status: int, code: str, detail: str) -> JsonResponse:
    """The API's error shape (`{"code", "detail"}`), for a scraper's logs and a person alike."""
    response = JsonResponse({"code": code, "detail": detail}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def metrics_refusal(request: HttpRequest) -> JsonResponse | None:
    """None when the caller may read the metrics (the bearer token METRICS_TOKEN, compared in
    constant time, or a signed-in active staff user), else the 401 or 403 that says what to do."""
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        token = settings.METRICS_TOKEN
        if token and hmac.compare_digest(credentials.strip().encode(), token.encode()):
            return None
        return _refusal(401, "authentication_failed",
                        "This bearer token does not open the metrics: send `Authorization: Bearer <METRICS_TOKEN>` "
                        "with the token the server is configured with, or sign in as staff.")
    user = request.user
    if not user.is_authenticated:
        return _refusal(401, "not_authenticated",
                        "The metrics need credentials: send `Authorization: Bearer <METRICS_TOKEN>`, or sign in as "
                        "staff at /admin/.")
    if not (user.is_active and user.is_staff):
        return _refusal(403, "permission_denied",
                        "The metrics are for staff: sign in with a staff account, or use the METRICS_TOKEN.")
    return None


def sees_detail(request: HttpRequest) -> bool:
    """May the caller read the probes' detail? Exactly those who may read the metrics."""
    return metrics_refusal(request) is None


def _probe_response(body: dict[str, Any], *, ok: bool, request: HttpRequest) -> JsonResponse:
    shown = body if sees_detail(request) else {"status": body["status"]}
    return JsonResponse(shown, status=200 if ok else 503)


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Every platform metric in Prometheus' text format (OpenMetrics when the scraper asks for
    it), computed now from the database and Redis by a registry made for this request."""
    refusal = metrics_refusal(request)
    if refusal is not None:
        return refusal
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector())
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)


def _error(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {exc}"


def _iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else datetime.fromtimestamp(timestamp, tz=UTC).isoformat()


def _worker_report(worker: WorkerSeen, now: float) -> dict[str, Any]:
    last_job_ago = worker.last_job_ago(now)
    return {
        "hostname": worker.hostname,
        "queues": worker.queues,
        "pid": worker.pid,
        "fresh": worker.is_fresh(now),
        "seen_seconds_ago": round(worker.seen_ago(now), 3),
        "last_job_seconds_ago": None if last_job_ago is None else round(last_job_ago, 3),
        "last_job_at": _iso(worker.last_job_at),
        "started_at": _iso(worker.started_at),
    }


def _workers_check(fresh: list[WorkerSeen], queues: list[dict[str, Any]]) -> str:
    """Ready when a fresh worker consumes the default queue, where every job without a queue of
    its own goes (a worker of another queue alone, such as beat's housekeeping, runs no job)."""
    default = settings.CELERY_TASK_DEFAULT_QUEUE
    stale_after = f"{settings.OPS_WORKER_STALE_AFTER:g} s"
    consumers = next(queue["workers"] for queue in queues if queue["name"] == default)
    if not consumers:
        return f"error: no worker consuming the queue {default!r} wrote a heartbeat in the last {stale_after}"
    return f"ok: {len(fresh)} seen in the last {stale_after}, {consumers} consuming {default!r}"


@never_cache
@require_safe  # GET and HEAD: what a probe sends
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database and Redis answer, 503 (naming the one that does not, to those who
    see the detail) otherwise."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure to reach the database is a failed check
        checks["database"] = _error(exc)
    try:
        client = redis_client(socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = _error(exc)
    healthy = all(value == "ok" for value in checks.values())
    return _probe_response({"status": "ok" if healthy else "unavailable", **checks}, ok=healthy, request=request)


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database and Redis answer, a worker that consumes the default queue wrote
    a heartbeat in the last OPS_WORKER_STALE_AFTER seconds, and the periodic passes' scheduler
    beats (its lease renewed within three SCHEDULER_HEARTBEAT_INTERVALs, every pass run lately:
    `ops.scheduler`); 503 otherwise. Lists each check, each worker (its queues, how long since it
    was seen and since it last took a job) and each queue (its depth and how many fresh workers
    consume it)."""
    now = 0.0  # Redis's time (ops.workers), as the heartbeats it judges: read with them
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure to reach the database is a failed check
        checks["database"] = _error(exc)
    workers: list[WorkerSeen] = []
    queues: list[dict[str, Any]] = []
    try:
        now = redis_now()
        workers = workers_seen(now=now)
        names = queue_names(workers)
        depths, _ = queue_depths(names)
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = _error(exc)
    else:
        fresh = [worker for worker in workers if worker.is_fresh(now)]
        queues = [
            {"name": name, "depth": depths[name], "workers": sum(name in worker.queues for worker in fresh)}
            for name in names
        ]
        checks["workers"] = _workers_check(fresh, queues)
    if "workers" not in checks:
        checks["workers"] = "error: unknown (Redis did not answer)"
    if checks["database"] == "ok":
        try:
            checks["scheduler"] = scheduler_check(scheduler_seen())
        except Exception as exc:
            checks["scheduler"] = _error(exc)
    else:
        checks["scheduler"] = "error: unknown (the database did not answer)"
    ready = all(value.startswith("ok") for value in checks.values())
    body = {
        "status": "ready" if ready else "unavailable",
        "checks": checks,
        "workers": [_worker_report(worker, now) for worker in workers],
        "queues": queues,
    }
    return _probe_response(body, ok=ready, request=request)
