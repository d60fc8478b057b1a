"""API bench: `POST /api/jobs/` against a bare DRF endpoint, served by the same server in one run.

    python bench/api.py [--requests 3000] [--concurrency 16] [--workers 2] [--repeat 1]

One ASGI server (uvicorn, the platform's ASGI application, `bench.api_settings`: the platform's
settings plus `POST /bench/bare/`) and one client process sending requests at a fixed concurrency
over keep-alive connections, each request authenticated with an API token:

1. bare: `POST /bench/bare/`, a DRF view with the same authentication, throttling, parsing and
   rendering as the API and no work of its own;
2. submit: `POST /api/jobs/` with `{"kind": "demo.noop"}` (with `--idempotency`, a fresh
   `idempotency_key` on each), which validates, inserts the job and its first event, and sends
   its Celery message after the commit (no worker runs: the jobs stay pending and are deleted
   at the end).

It prints requests per second and p50 / p99 latency of each phase and their ratio (the platform's
cost), writes `bench/results/api-<UTC timestamp>.json` and rewrites `bench/results/api-latest.md`.
Aim: at least 300 submits per second and p99 at most 50 ms. Uses DATABASE_URL and REDIS_URL when
set; else the embedded Redis and a SQLite file under var/. With BENCH_DB_POOL=1 (PostgreSQL, needs
the psycopg-pool package) the server uses psycopg's connection pool: under ASGI every request runs in
a thread of its own, so without a pool each one opens a new database connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script (`python bench/api.py`)
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import BenchError, prepare_environment  # noqa: E402

RESULTS_DIR = BASE_DIR / "bench" / "results"
SERVER_LOG = BASE_DIR / "var" / "bench-api-server.log"
BENCH_USER = "bench-api"
AIM_RATE = 300.0  # submits per second
AIM_P99_MS = 50.0
WARMUP = 200  # requests per phase before timing: connections open, code paths warm


@dataclass(frozen=True)
class Phase:
    name: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()},
            "per_second": round(self.per_second, 1),
        }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(*args: str) -> str:
    """Run `manage.py` with the bench's environment; return its output."""
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, capture_output=True, text=True)
    if result.returncode != 0:
        raise BenchError(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


class Server:
    """uvicorn serving the platform in its own process group, output to var/bench-api-server.log."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        import httpx

        SERVER_LOG.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            str(Path(sys.executable).parent / "uvicorn"),
            "taskplatform.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            "--no-access-log",
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(
            argv, cwd=BASE_DIR, stdout=SERVER_LOG.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the server exited ({self.proc.returncode}); see {SERVER_LOG}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise BenchError(f"the server did not answer within {timeout}s; see {SERVER_LOG}")

    def stop(self) -> None:
        import signal

        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


async def run_phase(name: str, url: str, token: str, count: int, concurrency: int, idempotency: bool) -> Phase:
    """Send `count` POSTs to `url` from `concurrency` tasks; time them (after a warm-up)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Token {token}"}
    latencies: list[float] = []
    errors = 0

    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:

        async def worker(queue: asyncio.Queue, record: bool) -> None:
            nonlocal errors
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body: dict[str, Any] = {"kind": "demo.noop", "input": {}}
                if idempotency:
                    body["idempotency_key"] = uuid.uuid4().hex
                started = time.perf_counter()
                response = await client.post(url, json=body)
                elapsed = time.perf_counter() - started
                if response.status_code != 201:
                    errors += 1
                if record:
                    latencies.append(elapsed)

        async def drive(n: int, record: bool) -> float:
            queue: asyncio.Queue = asyncio.Queue()
            for _ in range(n):
                queue.put_nowait(None)
            started = time.perf_counter()
            await asyncio.gather(*(worker(queue, record) for _ in range(concurrency)))
            return time.perf_counter() - started

        await drive(WARMUP, record=False)
        seconds = await drive(count, record=True)
    latencies.sort()
    return Phase(
        name=name,
        requests=count,
        seconds=seconds,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        errors=errors,
    )


def report(runs: list[dict[str, Phase]], setup: dict[str, Any], write: bool) -> None:
    best = {name: max((run[name] for run in runs), key=lambda phase: phase.per_second) for name in ("bare", "submit")}
    lines = [
        "| phase | requests | req/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|",
        *(
            f"| {p.name} | {p.requests} | {p.per_second:.0f} | {p.p50_ms:.1f} | {p.p99_ms:.1f} | {p.errors} |"
            for p in best.values()
        ),
    ]
    ratio = best["submit"].per_second / best["bare"].per_second
    ok = best["submit"].per_second >= AIM_RATE and best["submit"].p99_ms <= AIM_P99_MS
    verdict = (
        f"submit / bare = {ratio:.2f}; aim ≥ {AIM_RATE:.0f} submits/s and p99 ≤ {AIM_P99_MS:.0f} ms: "
        f"{'met' if ok else 'NOT met'}"
    )
    print("\n".join(lines))
    print(verdict)
    if not write:
        return
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    data = {
        "setup": setup,
        "runs": [{k: v.as_dict() for k, v in run.items()} for run in runs],
        "best": {k: v.as_dict() for k, v in best.items()},
        "ratio": round(ratio, 3),
        "aim_met": ok,
    }
    (RESULTS_DIR / f"api-{stamp}.json").write_text(json.dumps(data, indent=2) + "\n")
    described = ", ".join(f"{key} {value}" for key, value in setup.items())
    (RESULTS_DIR / "api-latest.md").write_text(
        f"# API bench, {stamp}\n\n{described}\n\n" + "\n".join(lines) + f"\n\n{verdict}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="timed requests per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--repeat", type=int, default=1, help="run both phases N times; report the best")
    parser.add_argument("--idempotency", action="store_true", help="send a fresh idempotency_key with each submit")
    parser.add_argument("--no-write", action="store_true", help="print only; write nothing under bench/results/")
    args = parser.parse_args()

    described = prepare_environment()
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.api_settings"
    # Throttling stays on (its cost is part of every request) but must never refuse the bench.
    os.environ["API_THROTTLE_RATE"] = "100000000/min"
    # Under ASGI every request runs its sync view in a thread of its own, so persistent database
    # connections (CONN_MAX_AGE > 0) pile up until PostgreSQL refuses clients; connect per request.
    os.environ.setdefault("DATABASE_CONN_MAX_AGE", "0")
    manage("migrate", "--noinput", "-v", "0")
    token = manage("create_api_token", BENCH_USER, "--create", "--name", "bench").strip().splitlines()[-1]
    server = Server(workers=args.workers)
    runs: list[dict[str, Phase]] = []
    try:
        server.start()
        for _ in range(args.repeat):
            run = {}
            for name, path in (("bare", "/bench/bare/"), ("submit", "/api/jobs/")):
                run[name] = asyncio.run(
                    run_phase(name, f"{server.url}{path}", token, args.requests, args.concurrency, args.idempotency)
                )
            runs.append(run)
    finally:
        server.stop()
        cleanup(described["redis_key_prefix"])
    setup = {
        "database": os.environ["DATABASE_URL"].split(":", 1)[0],
        "redis": described["redis_kind"],
        "db_pool": os.environ.get("BENCH_DB_POOL", "0") == "1",
        "server": f"uvicorn x{args.workers}",
        "concurrency": args.concurrency,
        "idempotency_key": args.idempotency,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    report(runs, setup, write=not args.no_write)
    return 0


def cleanup(prefix: str) -> None:
    """Delete the bench's jobs and its Redis keys (the undelivered Celery messages)."""
    import django

    django.setup()
    import redis
    from django.conf import settings

    from jobs.models import Job

    Job.objects.filter(owner__username=BENCH_USER).delete()
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


if __name__ == "__main__":
    sys.exit(main())
