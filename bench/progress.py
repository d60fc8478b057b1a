"""Live-progress bench: N websocket clients follow jobs that emit progress; latency and delivery.

    python bench/progress.py [--clients 100 1000] [--server-workers 1 2] [--jobs 10]
                             [--events 20] [--period 0.5] [--client-procs 2]

For each uvicorn process count and each client count N, against a real uvicorn serving
`taskplatform.asgi:application`:

1. `--jobs` jobs are created and claimed by this process, which then plays the worker: it
   reports progress through `JobContext.progress`, so every event is a row first, then goes out
   through the per-process publisher (`jobs.broadcast`) and the Redis channel layer, exactly as
   from a Celery worker;
2. N websocket clients (spread over `--client-procs` processes, each client on one job, round
   robin) connect to `/ws/jobs/{id}/?token=…` and wait for their snapshot;
3. every `--period` seconds each job reports progress once (`--events` times), then finishes;
4. each client records, for each progress event, the time it arrived minus the event's
   `created_at` (taken when the row is written, before the commit): emit-to-receive latency,
   on one machine's clock. A client also checks that its `seq`s have no gap or duplicate.

uvicorn runs with `--ws-per-message-deflate false` unless `--deflate`: compressing every small
event for every socket costs about a third more server CPU per message (47 against 64 µs at
1,000 clients on a 2-CPU machine).

It prints a table and rewrites `bench/results/progress-latest.md`. Uses DATABASE_URL and
REDIS_URL when set; else the embedded Redis and a SQLite file of its own under var/.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script (`python bench/progress.py`)
    sys.path.insert(0, str(BASE_DIR))

RESULTS = BASE_DIR / "bench" / "results" / "progress-latest.md"
BENCH_SQLITE = BASE_DIR / "var" / "bench-progress.sqlite3"
SERVER_LOG = BASE_DIR / "var" / "bench-progress-server.log"
AIM_P99_MS = 25.0


class BenchError(RuntimeError):
    pass


# --- The clients (a process of their own: `--client-proc`) --------------------------------------


async def client_run(url: str, job_ids: list[str], token: str, connect_batch: int = 50) -> dict[str, Any]:
    """Connect one websocket per entry of `job_ids`, say `ready`, then record until every job ends."""
    from websockets.asyncio.client import connect

    latencies: list[float] = []
    gaps = duplicates = progress_received = 0
    sockets = []

    async def open_one(job_id: str):
        ws = await connect(f"{url}/ws/jobs/{job_id}/?token={token}", max_queue=None, open_timeout=60)
        snapshot = json.loads(await ws.recv())
        return ws, snapshot["last_seq"]

    for start in range(0, len(job_ids), connect_batch):
        sockets += await asyncio.gather(*(open_one(job_id) for job_id in job_ids[start : start + connect_batch]))
    print("ready", flush=True)

    async def follow(ws, last_seq: int) -> None:
        nonlocal gaps, duplicates, progress_received
        while True:
            message = json.loads(await ws.recv())
            arrived = time.time()
            event = message["event"]
            if event["seq"] <= last_seq:
                duplicates += 1
                continue
            if event["seq"] != last_seq + 1:
                gaps += 1
            last_seq = event["seq"]
            if event["type"] == "progress":
                progress_received += 1
                latencies.append((arrived - datetime.fromisoformat(event["created_at"]).timestamp()) * 1000)
            elif event["type"] == "status" and event["status"] in ("completed", "failed", "cancelled"):
                await ws.close()
                return

    await asyncio.gather(*(follow(ws, last_seq) for ws, last_seq in sockets))
    return {"latencies_ms": latencies, "progress_received": progress_received, "gaps": gaps, "duplicates": duplicates}


def client_main(args: argparse.Namespace) -> None:
    result = asyncio.run(client_run(args.url, args.job_ids.split(","), args.token))
    print("result " + json.dumps(result), flush=True)


# --- The bench ---------------------------------------------------------------------------------


def prepare_environment() -> str:
    """Point this process (and the server it starts) at Redis and a database; return a label."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    os.environ.setdefault("DJANGO_DEBUG", "false")  # DEBUG records every SQL statement
    os.environ["REDIS_KEY_PREFIX"] = f"bench-progress-{uuid.uuid4().hex[:8]}:"
    redis = "external Redis"
    if not os.environ.get("REDIS_URL"):
        from devtools import embedded_redis

        os.environ["REDIS_URL"] = embedded_redis.start()
        redis = "embedded Redis"
    database = "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    if database == "PostgreSQL":
        postgres_database_ensure(os.environ["DATABASE_URL"])
    if not os.environ.get("DATABASE_URL"):
        BENCH_SQLITE.parent.mkdir(parents=True, exist_ok=True)
        for leftover in BENCH_SQLITE.parent.glob(BENCH_SQLITE.name + "*"):
            leftover.unlink()
        os.environ["DATABASE_URL"] = f"sqlite:///{BENCH_SQLITE}"
    return f"{database}, {redis}"


def postgres_database_ensure(url: str) -> None:
    """Create the database that `url` names unless it exists."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    maintenance = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user + system) of every process in process group `pgid` so far (Linux /proc)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that just ended
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class Server:
    """uvicorn serving the platform, its output in var/bench-progress-server.log."""

    def __init__(self, workers: int, deflate: bool, ws: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.deflate = deflate
        self.ws = ws
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        import httpx

        argv = [sys.executable, "-m", "uvicorn", "taskplatform.asgi:application", "--host", "127.0.0.1",
                "--port", str(self.port), "--lifespan", "off", "--log-level", "warning",
                "--workers", str(self.workers), "--ws-per-message-deflate", str(self.deflate).lower()]  # fmt: skip
        if self.ws:
            argv += ["--ws", self.ws]
        SERVER_LOG.parent.mkdir(parents=True, exist_ok=True)
        with SERVER_LOG.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"uvicorn exited:\n{SERVER_LOG.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise BenchError("uvicorn did not answer within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)


def run_round(
    server: Server, token: str, owner: Any, *, clients: int, jobs: int, events: int, period: float, client_procs: int
) -> dict[str, Any]:
    """One measurement: `clients` sockets over `jobs` jobs, each job reporting `events` times."""
    from unittest import mock

    from jobs.broadcast import publisher
    from jobs.models import JobEvent
    from jobs.runtime import JobContext
    from jobs.services import job_claim, job_complete, job_submit

    with mock.patch("jobs.services.job_dispatch"):  # this process plays the worker
        contexts = [
            JobContext(job_claim(job_id=job_submit(kind="demo.noop", input={}, owner=owner)[0].pk)) for _ in range(jobs)
        ]
    assignments = [str(contexts[index % jobs].job_id) for index in range(clients)]
    procs = []
    for part in range(client_procs):
        share = assignments[part::client_procs]
        if share:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--client-proc",
                        "--url",
                        server.url.replace("http", "ws", 1),
                        "--job-ids",
                        ",".join(share),
                        "--token",
                        token,
                    ],
                    cwd=BASE_DIR,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
    for proc in procs:
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise BenchError(f"a client process did not connect: {line!r}")

    # Each job reports `events` times, every `period`, the jobs spread evenly across the period.
    server_cpu = group_cpu_seconds(server.proc.pid)
    started = time.monotonic()
    for round_number in range(1, events + 1):
        for index, ctx in enumerate(contexts):
            due = started + (round_number - 1) * period + index * period / jobs
            time.sleep(max(0.0, due - time.monotonic()))
            ctx.progress(round_number / events, f"{round_number} of {events}")
    emitting = time.monotonic() - started
    time.sleep(period)  # let the last reports arrive before the server's CPU time is read
    server_cpu = group_cpu_seconds(server.proc.pid) - server_cpu
    for ctx in contexts:
        ctx.flush()
        job_complete(job=ctx.job, result={})
    publisher().flush(30)
    # Coalescing may merge two reports that came closer than 100 ms (a late emitter): count rows.
    written = {str(ctx.job_id): JobEvent.objects.filter(job_id=ctx.job_id, type="progress").count() for ctx in contexts}

    latencies: list[float] = []
    received = gaps = duplicates = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        line = next((item for item in out.splitlines() if item.startswith("result ")), None)
        if line is None:
            raise BenchError(f"a client process gave no result: {out[-2000:]!r}")
        result = json.loads(line[len("result ") :])
        latencies += result["latencies_ms"]
        received += result["progress_received"]
        gaps += result["gaps"]
        duplicates += result["duplicates"]
    latencies.sort()
    expected = sum(written[job_id] for job_id in assignments)

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")

    return {
        "server_procs": server.workers,
        "clients": clients,
        "jobs": jobs,
        "events_per_job": events,
        "period_s": period,
        "expected": expected,
        "received": received,
        "delivery": received / expected if expected else 1.0,
        "gaps": gaps,
        "duplicates": duplicates,
        "p50_ms": quantile(0.50),
        "p99_ms": quantile(0.99),
        "max_ms": latencies[-1] if latencies else float("nan"),
        "mean_ms": statistics.fmean(latencies) if latencies else float("nan"),
        "messages_per_s": received / max(emitting, 1e-9),
        # while the reports flow (connecting and closing the clients excluded)
        "server_cpu_us_per_message": server_cpu / max(received, 1) * 1e6,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| uvicorn procs | clients | jobs | reports/job | msgs/s | delivered | ratio | gaps | dups "
        "| p50 ms | p99 ms | max ms | server CPU µs/msg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['server_procs']} | {row['clients']} | {row['jobs']} | {row['events_per_job']} "
            f"| {row['messages_per_s']:.0f} | {row['received']}/{row['expected']} | {row['delivery']:.2%} "
            f"| {row['gaps']} | {row['duplicates']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
            f"| {row['max_ms']:.1f} | {row['server_cpu_us_per_message']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000], help="client counts to measure")
    parser.add_argument("--server-workers", type=int, nargs="+", default=[1, 2], help="uvicorn process counts")
    parser.add_argument("--jobs", type=int, default=10, help="jobs emitting progress at once")
    parser.add_argument("--events", type=int, default=20, help="progress reports per job")
    parser.add_argument("--period", type=float, default=0.5, help="seconds between two reports of one job (>= 0.1)")
    parser.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over")
    parser.add_argument("--deflate", action="store_true",
                        help="let uvicorn compress websocket messages (its default; off here, see the docstring)")
    parser.add_argument("--ws", help="uvicorn's websocket implementation (default: uvicorn's own default)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/")
    parser.add_argument("--client-proc", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--job-ids", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_proc:
        client_main(args)
        return
    if args.period < 0.1:
        parser.error("--period below 0.1 s: ctx.progress coalesces reports closer than 100 ms")

    setup = prepare_environment()
    import django

    django.setup()
    from django.core.management import call_command

    from accounts.services import api_token_create, user_ensure

    call_command("migrate", verbosity=0)
    owner, _ = user_ensure(username="bench-progress")
    token = api_token_create(user=owner, name="bench")[1]
    rows = []
    for workers in args.server_workers:
        server = Server(workers, args.deflate, args.ws)
        server.start()
        try:
            for clients in args.clients:
                row = run_round(server, token, owner, clients=clients, jobs=args.jobs, events=args.events,
                                period=args.period, client_procs=args.client_procs)
                rows.append(row)
                print(f"uvicorn x{workers}, {clients} clients: p50 {row['p50_ms']:.1f} ms, "
                      f"p99 {row['p99_ms']:.1f} ms, delivered {row['delivery']:.2%}", flush=True)
        finally:
            server.stop()

    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    header = (
        f"{setup}; uvicorn (ws {args.ws or 'default'}, permessage-deflate {'on' if args.deflate else 'off'}); "
        f"clients in {args.client_procs} process(es); each job reports every {args.period} s; {machine}"
    )
    report = table(rows)
    print(f"\n{header}\n{report}")
    judged = [row for row in rows if row["clients"] >= 1000]
    verdicts = {row["server_procs"]: row["p99_ms"] <= AIM_P99_MS and row["delivery"] == 1.0 for row in judged}
    verdict = "; ".join(f"uvicorn x{procs}: {'met' if ok else 'NOT met'}" for procs, ok in verdicts.items())
    verdict = verdict or "not measured"
    print(f"\naim (p99 <= {AIM_P99_MS:.0f} ms at 1,000 clients, 100 % delivered): {verdict}")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            "# Live progress: emit-to-receive latency and delivery\n\n"
            f"Written by `bench/progress.py` at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.\n\n"
            f"{header}.\n\n"
            "Latency: from the progress row's `created_at` (taken as the row is written, before its commit) "
            "to the websocket client's receipt, on one clock; it includes the durable write. Server CPU: "
            "the uvicorn processes' CPU time while the reports flow, per message delivered.\n\n"
            f"{report}\n\nAim: p99 <= {AIM_P99_MS:.0f} ms at 1,000 clients, 100 % delivered: {verdict}.\n"
        )
        print(f"wrote {RESULTS.relative_to(BASE_DIR)}")


if __name__ == "__main__":
    main()
