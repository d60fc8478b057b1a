"""The shipped configuration under load: `make run`'s processes against PostgreSQL and Redis, with
bare Celery measured beside it in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_shipped REDIS_URL=redis://127.0.0.1:6379/8 \\
        .venv/bin/python bench/shipped.py

It starts the platform exactly as `make run` does (`python -m devtools.supervisor` with the
development settings: web, worker, platform worker, beat, Flower), on a database of its own that
it creates and drops, and a Redis database it flushes. Then, one phase after another:

1. **bare** — a plain Celery app (no Django; late acks, prefetch 1, the worker's concurrency),
   its worker started beside the platform, N no-op tasks until a Redis counter says all ran.
   **peer** — Procrastinate (bench/peer_procrastinate.py), a job queue whose queue is a PostgreSQL
   table: as many worker processes as the worker's concurrency, N no-op jobs deferred 500 to a
   transaction, until its table says all N succeeded. The issue's peer, in the same run.
2. **bare + SQL** — the same plain Celery app running, per job, the two statements the platform's
   worker runs for a no-op job (taken from the platform at the start of the run) on copies of its
   tables, the jobs submitted as `manage.py submit` writes them (bench/bare_durable.py): what
   Celery, PostgreSQL and Redis cost for a job that survives a crash, without the platform's code.
3. **platform** — `manage.py submit demo.noop --count N`, as a user types it, timed until the
   database says all N jobs are `completed`.
4. **api** — 8 clients (a separate process) POST `/api/jobs/` with a token for `--api-seconds`,
   while the workers run the jobs they submit: requests/s, p50, p99, and the CPU the clients
   themselves took (pre-encoded requests on keep-alive connections: little, so the cores are
   the server's).
   **api-floor** — the same clients against `POST /bench/floor/` (bench/api_urls.py), served by
   `make run`'s web command line with the bench's URLconf while the bare + SQL worker runs each
   submitted job: the API's authentication, throttle, parser and renderer, one INSERT of the job
   and its first event, Celery's message. What the substrate (Django, DRF, PostgreSQL, Redis,
   Celery) gives for a durable submit on this machine, beside the platform's figure.
   **api-paced**, **api-floor-paced** — the same two, the clients paced to `--api-rate` requests a
   second in all (the aim's 300), each request timed from when it fell due rather than from when
   it was sent: the latency at that load, where the two above give it at the most the server takes.
5. **answer→processing** — `demo.review` jobs paused on their question; a websocket follows each
   job (`/ws/jobs/{id}/`, a staff user's ticket), which is answered with
   `POST /api/questions/{id}/answer/` and timed until its `processing` event arrives on the socket
   (and, beside it, until the event's row was written: `row_ms`; a frame timed that is not that
   row's event, by its number, is listed in `frames_unlike_their_row`).
6. **wake→running** — `demo.generate` jobs parked with `drop_callback`; each wake callback is
   POSTed the same way and timed until its `processing` event arrives on the job's websocket.
7. **handoff** — bare Celery's own hand-off: one message at a time to an idle bare worker, from
   before `apply_async` to the task's first line. The part of 5 and 6 that is Celery's.
8. **start** — a process's start, spawn to exit, alternating: `manage.py submit demo.noop --count 1`
   (the platform phase's submitter with one job) and a bare Django + Celery process doing the
   least a submitter must (bench/bare_start.py). The platform phase's window opens with that start
   (its "first claim after"); each round also gives the worker's pace from its first claim to its
   last job against bare Celery ("platform drained × bare").

Each durable phase (peer, bare + SQL, platform) ends when its last job finished, as that job's row
says (the database's clock on the same host); the bench looks at the rows every quarter of a second,
and the moment it saw them all is kept beside it (`seconds_polled`). Bare Celery's ends when the
bench, looking at its counter every 20 ms, sees it reach N.

The total RSS of the platform's processes is taken idle and at the end of the platform phase. Each
throughput phase has a CPU budget per job by part (`CpuBudget`), and each latency phase a probe of
PostgreSQL's own commit latency beside it (`CommitProbe`), set against its slowest requests.
`--scale` repeats the throughput at 1, 2 and 4 worker processes and the API figure at 1, 2 and 4
web processes (WORKER_CONCURRENCY and WEB_CONCURRENCY, as a user sets them). Figures are printed
and written to bench/results/shipped-*.json and shipped-latest.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from bench.recovery import port_free as free_port  # noqa: E402
from bench.recovery import wait_for  # noqa: E402
from bench.throughput import results_save, run_header  # noqa: E402
from bench.wake import percentile  # noqa: E402
from devtools.priority import lower_priority, nice_value  # noqa: E402

VENV_BIN = Path(sys.executable).parent
# The virtualenv that `make run` installs (production's hash-checked packages and the development
# extras, nothing of the test tools), made by the Makefile's own target (`--venv run`, the default).
# `make run`'s processes, `manage.py submit` and the baseline workers run from it. The bench itself
# runs from the development one (it needs psutil, py-spy and the platform's test tools).
RUN_VENV = BASE_DIR / "var" / "bench-run-venv"
# The bin directory the measured processes run from: set by `main` (`--venv`).
RUN_BIN = VENV_BIN
AIMS = {"ratio": 0.6, "api_per_second": 300, "api_p99_ms": 50, "answer_p50_ms": 15, "answer_p99_ms": 40,
        "wake_p99_ms": 40}


def summary_ms(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": round(statistics.median(values), 1), "p99": round(percentile(values, 0.99), 1),
            "max": round(max(values), 1)}


# A request slower than this (the API's p99 aim) is looked at against the commit probe.
SLOW_REQUEST_MS = 50.0


class CommitProbe:
    """PostgreSQL's own commit latency while a phase runs: a thread of its own, on a connection of
    its own, commits one small row every `interval` seconds and times each commit. Every answer,
    wake and submit waits for at least one commit (its WAL flushed to disk), so a stall of the
    disk stalls them all at once; the probe's worst commit inside a slow request's window says
    whether that request waited on the substrate. Its table goes at the end."""

    def __init__(self, dsn: str, interval: float = 0.02, table: str = "bench_commit_probe") -> None:
        self.dsn, self.interval, self.table = dsn, interval, table
        self.commits: list[tuple[float, float]] = []  # (start, seconds), time.perf_counter's clock
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-commit-probe", daemon=True)

    def __enter__(self) -> CommitProbe:
        import psycopg

        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (id bigserial PRIMARY KEY, at timestamptz)")
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            started = time.perf_counter()
            self.conn.execute(f"INSERT INTO {self.table} (at) VALUES (now())")
            self.commits.append((started, time.perf_counter() - started))

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        self.conn.execute(f"DROP TABLE IF EXISTS {self.table}")
        self.conn.close()

    def worst_ms(self, start: float, end: float) -> float:
        """The slowest probe commit that overlapped [start, end] (perf_counter's clock), in ms."""
        overlapping = [took for began, took in self.commits if began <= end and began + took >= start]
        return round(max(overlapping, default=0.0) * 1000, 1)

    def took_ms(self) -> list[float]:
        return [seconds * 1000 for _, seconds in self.commits]

    def summary(self) -> dict[str, Any]:
        return commits_summary(self.took_ms())


def commits_summary(took_ms: list[float]) -> dict[str, Any]:
    """The commit probe's figures over the commits that took `took_ms` (one probe's, or several's)."""
    if not took_ms:
        return {}
    return {**summary_ms(took_ms), "over_50_ms": sum(1 for ms in took_ms if ms > 50)}


class PgWaits:
    """What PostgreSQL's backends running a job's moves were doing while a throughput phase ran
    (`--pg-waits`): `pg_stat_activity` read every `interval` seconds on a connection of its own, in
    a thread of its own, and each active backend whose statement is a move (`WITH j AS (UPDATE`:
    the claim and the outcome, the platform's and the floor's alike) counted by its wait: on the
    CPU, flushing the write-ahead log (its commit's `WALSync`/`WALWrite` I/O), waiting for another
    backend's flush (the `WALWrite` lock), waiting for its client, or something else. Off unless
    asked for: the reads take some of PostgreSQL's CPU from the phase (about 200 a second)."""

    MOVE = "WITH j AS (UPDATE%"
    KINDS = ("on the CPU", "flushing the log", "waiting for another's flush", "waiting for the client", "other")

    def __init__(self, dsn: str | None, interval: float = 0.005) -> None:
        self.dsn, self.interval = dsn, interval
        self.counts = dict.fromkeys(self.KINDS, 0)
        self.samples = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-pg-waits", daemon=True)

    @classmethod
    def kind(cls, wait_type: str | None, wait: str | None) -> str:
        if wait_type is None:
            return "on the CPU"
        if wait_type == "IO" and wait in ("WALSync", "WALWrite"):
            return "flushing the log"
        if wait_type == "LWLock" and wait == "WALWrite":
            return "waiting for another's flush"
        if wait_type == "Client":
            return "waiting for the client"
        return "other"

    def __enter__(self) -> PgWaits:
        if self.dsn is not None:
            import psycopg

            self.conn = psycopg.connect(self.dsn, autocommit=True)
            self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            rows = self.conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE state = 'active' "
                "AND datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
                [self.MOVE]).fetchall()
            self.samples += 1
            for wait_type, wait in rows:
                self.counts[self.kind(wait_type, wait)] += 1

    def __exit__(self, *exc: object) -> None:
        if self.dsn is not None:
            self.stopping.set()
            self.thread.join(timeout=30)
            self.conn.close()

    def summary(self) -> dict[str, Any]:
        """Each kind's share of the moves' active time (%), how many samples, and how many moves
        were active in a sample on average. Empty when off."""
        seen = sum(self.counts.values())
        if self.dsn is None or not self.samples:
            return {}
        return {"samples": self.samples, "active_per_sample": round(seen / self.samples, 2),
                "shares_percent": {kind: round(100 * count / seen, 1) if seen else 0.0
                                   for kind, count in self.counts.items()}}


def pg_waits_text(waits: dict[str, Any] | None) -> str:
    """A phase's `PgWaits.summary()` on one line (empty without one)."""
    if not waits:
        return ""
    shares = ", ".join(f"{kind} {share:.0f} %" for kind, share in waits["shares_percent"].items() if share >= 0.5)
    return (f"PostgreSQL's backends on the job's moves: {shares} ({waits['samples']} samples, "
            f"{waits['active_per_sample']} active in each)")


# --- The platform as `make run` starts it ------------------------------------------------------------


class Platform:
    """`python -m devtools.supervisor` (what `make run` execs), its output in var/bench-shipped.log."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.url = f"http://127.0.0.1:{env['PORT']}"
        self.proc: subprocess.Popen | None = None
        self.log_path = BASE_DIR / "var" / "bench-shipped.log"

    def start(self) -> None:
        self.log_path.parent.mkdir(exist_ok=True)
        # The platform's modules compiled first, as the image does (`compileall` in the Dockerfile)
        # and as Python does on its own where PYTHONDONTWRITEBYTECODE is unset (on its first
        # start): where it is set and nothing was compiled, every process (each `manage.py submit`
        # too) would compile them again at its start, about 0.15 s of CPU a process.
        subprocess.run([str(RUN_BIN / "python"), "-m", "compileall", "-q", "-x", r"/(\.venv|\.git|var|node_modules)/",
                        "."], cwd=BASE_DIR, check=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([str(RUN_BIN / "python"), "-m", "devtools.supervisor"], cwd=BASE_DIR, env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        import httpx

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise SystemExit(f"bench: make run's supervisor exited; see {self.log_path}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        logging.getLogger("httpx").setLevel(logging.WARNING)
        wait_for(ready, 120, "the platform's /readyz answering 200", interval=0.5)
        time.sleep(3)  # let the workers finish starting (readyz needs one consuming worker)

    def rss_mb(self) -> float:
        import psutil

        root = psutil.Process(self.proc.pid)
        total = 0
        for process in [root, *root.children(recursive=True)]:
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return round(total / 2**20, 1)

    def cpu_by_service(self) -> dict[str, float]:
        """CPU seconds so far of each service (its process and children), by its command line."""
        import psutil

        root = psutil.Process(self.proc.pid)
        times = root.cpu_times()
        found: dict[str, float] = {"supervisor": times.user + times.system, **servers_cpu_seconds()}
        for child in root.children(recursive=False):
            try:
                argv = child.cmdline()
                name = service_name(argv)
                times = [child.cpu_times(), *[c.cpu_times() for c in child.children(recursive=True)]]
                found[name] = found.get(name, 0.0) + sum(spent(t) for t in times)
            except psutil.NoSuchProcess:
                continue
        return found

    def service_pid(self, name: str) -> int | None:
        import psutil

        for child in psutil.Process(self.proc.pid).children(recursive=False):
            try:
                if service_name(child.cmdline()) == name:
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def stop(self) -> None:
        """SIGTERM to the supervisor (as Ctrl-C to make run), then SIGKILL to whatever of its tree
        is left: every service runs in a process group of its own."""
        import psutil

        if self.proc is None:
            return
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for process in tree:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue


def run_venv_made() -> Path:
    """`make run`'s virtualenv under var/ (`RUN_VENV`), made or brought up to date by the Makefile's
    own target, as `make run` does it: its bin directory. The development virtualenv holds the test
    tools as well, and some of them change what the platform imports at every start (httpx loads
    its command line with `rich` when `rich` is there; DRF imports `requests` when it is there)."""
    made = subprocess.run(["make", "--no-print-directory", f"VENV={RUN_VENV.relative_to(BASE_DIR)}",
                           f"{RUN_VENV.relative_to(BASE_DIR)}/bin/.installed-run"],
                          cwd=BASE_DIR, capture_output=True, text=True)
    if made.returncode:
        raise SystemExit(f"bench: could not make the run virtualenv ({RUN_VENV}):\n{made.stdout[-1500:]}"
                         f"{made.stderr[-1500:]}")
    return RUN_VENV / "bin"


def service_name(argv: list[str]) -> str:
    joined = " ".join(argv)
    if "uvicorn" in joined or "gunicorn" in joined:
        return "web"
    if " flower" in joined:
        return "flower"
    if " beat" in joined:
        return "beat"
    if "-Q platform" in joined:
        return "platform-worker"
    if " worker" in joined:
        return "worker"
    return Path(argv[0]).name if argv else "?"


class Profile:
    """py-spy sampling one service (and its children) for `seconds`, as collapsed stacks. By
    default only the threads holding the GIL, so the shares are of the Python CPU time, not of
    the waits; with `PROFILE_WALL` (`--profile-wall`), every thread, idle ones included, so the
    shares are of the wall-clock time (where a run waits: a socket, a lock, the next message)."""

    wall = False

    def __init__(self, shipped: Platform | None, service: str, seconds: float, out_dir: Path | None,
                 name: str | None = None, pid: int | None = None) -> None:
        self.proc = None
        self.path = None
        py_spy = VENV_BIN / "py-spy"
        if out_dir is None or not py_spy.exists():
            return
        if pid is None and shipped is not None:
            pid = shipped.service_pid(service)
        if pid is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / f"{name or service}.txt"
        self.proc = subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--subprocesses", "--nonblocking",
                                      "--rate", "200", *(["--idle", "--threads"] if self.wall else ["--gil"]),
                                      "--duration", str(int(seconds)), "--format", "raw",
                                      "--output", str(self.path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def top(self, count: int = 25) -> list[tuple[str, float]]:
        """The frames most often on the stack (inclusive), as shares of the samples."""
        if self.proc is None:
            return []
        self.proc.wait(timeout=120)
        totals: dict[str, int] = {}
        samples = 0
        for line in self.path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():  # a frame's name that held a line break (a psycopg `PREPARE` comment)
                continue
            samples += int(n)
            for frame in {f.split(" (")[0] + " (" + f.rsplit("/", 1)[-1].split(":")[0] if " (" in f else f
                          for f in stack.split(";")[1:]}:
                totals[frame] = totals.get(frame, 0) + int(n)
        ranked = sorted(totals.items(), key=lambda item: -item[1])[:count]
        return [(frame, round(n / max(samples, 1), 3)) for frame, n in ranked]


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after.get(name, 0.0) - before.get(name, 0.0), 2) for name in sorted(after)}


# --- Phases ------------------------------------------------------------------------------------------


def spent(times: Any) -> float:
    """A process's CPU seconds from psutil's `cpu_times()`: its own and those of its children that
    ended and were waited for (live children count on their own, once)."""
    return times.user + times.system + times.children_user + times.children_system


def servers_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of PostgreSQL's and Redis's processes on this machine, each process's own
    and its ended children's (`spent`: a closed connection's backend). Another user of the same
    servers would count too: run the bench on a quiet machine."""
    import psutil

    found = {"postgres": 0.0, "redis": 0.0}
    for process in psutil.process_iter(["name"]):
        name = process.info["name"] or ""
        key = "postgres" if name.startswith("postgres") else "redis" if name.startswith("redis-server") else None
        if key:
            try:
                found[key] += spent(process.cpu_times())
            except psutil.NoSuchProcess:
                continue
    return found


def worker_cpu_split(pid: int) -> dict[str, float]:
    """CPU seconds so far of a Celery worker: its main process (the consumer: fetching, acking,
    handing each message to the pool) apart from its pool processes (the tasks), ended ones
    included."""
    import psutil

    main = psutil.Process(pid)
    own = main.cpu_times()
    pool = own.children_user + own.children_system
    for child in main.children(recursive=True):
        try:
            pool += spent(child.cpu_times())
        except psutil.NoSuchProcess:
            continue
    return {"celery_main": own.user + own.system, "pool": pool}


class CpuBudget:
    """CPU milliseconds per job of each part of a throughput phase, from `start()` to `stop(n)`:
    the worker's main process and its pool processes, PostgreSQL, Redis, and the submitter (this
    process, or the children it ran). The phases' budgets side by side say where the platform
    spends more than bare Celery and the floor: whose CPU, not only how fast."""

    def __init__(self, worker_pid: int) -> None:
        self.worker_pid = worker_pid

    def _now(self) -> dict[str, float]:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        submitter = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        return {**worker_cpu_split(self.worker_pid), **servers_cpu_seconds(), "submitter": submitter}

    def start(self) -> None:
        self.before = self._now()

    def stop(self, jobs: int) -> dict[str, float]:
        after = self._now()
        budget = {name: round((after[name] - self.before[name]) * 1000 / jobs, 3) for name in after}
        budget["total"] = round(sum(budget.values()), 3)
        return budget


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid` and its children so far, ended ones included."""
    return round(sum(worker_cpu_split(pid).values()), 2)


def baseline_priority(pid: int) -> None:
    """A baseline's workers at the priority `make run` gives the platform's (WORKER_NICE, as the
    supervisor reads it: devtools/priority.py), so every side yields the cores to the same others
    (the submitter, the API's web processes) alike."""
    lower_priority(pid, nice_value(os.environ.get("WORKER_NICE")))


@contextlib.contextmanager
def baseline_worker(app: str, queue: str, concurrency: int, redis_url: str,
                    env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A bare Celery worker of `app` on `queue` (late acks, prefetch 1, as the app sets), stopped
    with its pool at the end.

    Without `DJANGO_SETTINGS_MODULE`, which the bench sets for itself: Celery installs its Django
    fix-up into any app made while that is set, and the fix-up sets Django up in the worker, which
    loads the platform (`taskplatform`'s Celery signal receivers included) and runs the fix-up's and
    the platform's receivers around every task. A baseline that paid them was not bare
    (`bench.bare_celery.refuse_django` stops such a worker at its start)."""
    env = {**os.environ, "BARE_CELERY_BROKER": redis_url, "PYTHONPATH": str(BASE_DIR), **(env or {})}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    worker = subprocess.Popen(
        [str(RUN_BIN / "celery"), "-A", app, "worker", "-l", "WARNING", "-c", str(concurrency),
         "-Q", queue, "--without-mingle", "--without-gossip", "--pool", "prefork"],
        cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    baseline_priority(worker.pid)
    try:
        yield worker
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)


def bare_phase(count: int, concurrency: int, redis_url: str, ack_emulation: str = "on") -> dict[str, Any]:
    """N no-op tasks of a plain Celery app, on a worker with the platform worker's settings, with
    kombu's acknowledgement emulation as Celery has it by default (`ack_emulation` "on") or not."""
    import redis

    env = {"BARE_ACK_EMULATION": ack_emulation}
    with baseline_worker("bench.bare_celery", "bare", concurrency, redis_url, env) as worker:
        from bench import bare_celery

        bare_celery.app.conf.broker_url = redis_url
        client = redis.Redis.from_url(redis_url)
        key = f"bench:bare:{uuid.uuid4().hex[:8]}"
        bare_celery.noop.apply_async(args=[key + ":warm"], queue="bare")
        wait_for(lambda: client.get(key + ":warm"), 60, "the bare worker's first task")
        budget = CpuBudget(worker.pid)
        budget.start()
        started = time.perf_counter()
        for _ in range(count):
            bare_celery.noop.apply_async(args=[key], queue="bare")
        enqueued = time.perf_counter() - started
        wait_for(lambda: int(client.get(key) or 0) >= count, 600, f"{count} bare tasks", interval=0.02)
        seconds = time.perf_counter() - started
        cpu_ms = budget.stop(count)
        client.delete(key, key + ":warm")
        return {"count": count, "seconds": round(seconds, 3), "per_second": round(count / seconds, 1),
                "enqueue_seconds": round(enqueued, 3), "worker_cpu_seconds_with_start": tree_cpu_seconds(worker.pid),
                "cpu_ms_per_job": cpu_ms, "ack_emulation": ack_emulation}


def vacuumed(conn: Any, *tables: str) -> None:
    """`VACUUM ANALYZE` of `tables` before a durable phase (the platform's, the floor's and the
    peer's alike), as autovacuum keeps a busy queue's tables in steady state. Without it each round
    runs on the dead rows of the rounds before, which autovacuum (a pass a minute) has not reached
    yet: Procrastinate, which finds its next job by scanning its table's index, fell from 522 to
    263 jobs a second over three rounds (2026-12-04 23:01 UTC)."""
    for table in tables:
        conn.execute(f"VACUUM ANALYZE {table}")


# PostgreSQL's activity counters reach pg_stat_user_tables within a second of a connection going
# idle (PGSTAT_MIN_INTERVAL): a phase's are read this long after its last job.
STATS_FLUSH_SECONDS = 1.2


class TableScans:
    """The scans of a jobs table during a phase, from PostgreSQL's counters: sequential scans and
    the rows they read, index scans. A job is found by key (its moves, its events' foreign-key
    checks), so a sequential scan per job says a connection kept a plan made for a table of a
    few rows (bench/README.md, "A plan made on a one-row table")."""

    SQL = "SELECT seq_scan, seq_tup_read, COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = %s"

    def __init__(self, connection: Any, table: str) -> None:
        """`connection`: psycopg's or Django's (a cursor is taken for each read)."""
        self.connection, self.table = connection, table
        self.before = self._read()

    def _read(self) -> tuple[int, int, int]:
        with self.connection.cursor() as cursor:
            cursor.execute(self.SQL, [self.table])
            row = cursor.fetchone()
        return tuple(row) if row else (0, 0, 0)

    def stop(self) -> dict[str, int]:
        """The counts since the start, read once the counters have reached the server."""
        time.sleep(STATS_FLUSH_SECONDS)
        after = self._read()
        sequential, rows, by_index = (now - then for now, then in zip(after, self.before, strict=True))
        return {"table": self.table, "sequential": sequential, "rows_read_sequentially": rows, "by_index": by_index}


def scans_text(scans: dict[str, Any] | None) -> str:
    if not scans:
        return ""
    return (f"; {scans['table']}: {scans['sequential']} sequential scans ({scans['rows_read_sequentially']} rows), "
            f"{scans['by_index']} by index")


def peer_database_url() -> str:
    """The peer's database beside the bench's own: `<name>_peer` on the same server."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "_peer", parts.query, ""))


def peer_prepare(url: str, *, warm_jobs: int = 0, concurrency: int = 1) -> None:
    """The peer's database made afresh with Procrastinate's schema (once per run, like the floor's
    tables: its rows stay from round to round, as the platform's do), then `warm_jobs` jobs run
    through it untimed. Procrastinate finds each job with a statement inside a PL/pgSQL function,
    whose plan a worker keeps once made: made on an empty table, it was a poor one for a table of
    thousands (a new table's first 500 jobs ran at 123 a second, the next 500 at 625). So its
    first round runs on a table in use, with statistics taken (`vacuumed`), as a busy queue's is."""
    from bench import peer_procrastinate

    database_recreate(url)
    peer_procrastinate.schema_apply(url)
    if warm_jobs:
        peer_phase(warm_jobs, concurrency, url)


@contextlib.contextmanager
def peer_workers(concurrency: int, url: str) -> Iterator[subprocess.Popen]:
    """`concurrency` Procrastinate worker processes under one parent, on the database at `url`,
    stopped at the end."""
    from bench import peer_procrastinate

    env = {**os.environ, peer_procrastinate.DSN_ENV: url, "PYTHONPATH": str(BASE_DIR)}
    workers = subprocess.Popen([sys.executable, "-m", "bench.peer_procrastinate", "workers", str(concurrency)],
                               cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    baseline_priority(workers.pid)
    try:
        yield workers
    finally:
        os.killpg(workers.pid, signal.SIGTERM)
        try:
            workers.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(workers.pid, signal.SIGKILL)
            workers.wait(timeout=10)


def peer_phase(count: int, concurrency: int, url: str) -> dict[str, Any]:
    """Procrastinate's no-op jobs (bench/peer_procrastinate.py) on the database at `url`
    (`peer_prepare`), from the first deferral until its table says all N succeeded."""
    import psycopg

    from bench import peer_procrastinate

    with psycopg.connect(url, autocommit=True) as conn, peer_workers(concurrency, url) as workers:
        vacuumed(conn, *peer_procrastinate.TABLES)
        done = peer_procrastinate.succeeded(conn)
        peer_procrastinate.submit(url, 1)
        wait_for(lambda: peer_procrastinate.succeeded(conn) > done or workers.poll() is not None, 60,
                 "Procrastinate's first job")
        if workers.poll() is not None:
            raise SystemExit(f"bench: Procrastinate's workers exited: {workers.stderr.read().decode()[-2000:]}")
        done += 1
        budget = CpuBudget(workers.pid)
        budget.start()
        since, started = datetime.now(UTC), time.perf_counter()  # the window's start, on both clocks
        ids = peer_procrastinate.submit(url, count)
        submitted = time.perf_counter() - started
        wait_for(lambda: peer_procrastinate.succeeded(conn) >= done + count, 600, f"{count} Procrastinate jobs",
                 interval=0.25)
        seconds = time.perf_counter() - started
        cpu_ms = budget.stop(count)
        first, last = peer_procrastinate.drain_span(conn, ids)
        return {"count": count, **window_figures(count, seconds, since, last),
                "submit_seconds": round(submitted, 3), **drain_figures(count, since, first, last),
                "worker_cpu_seconds_with_start": tree_cpu_seconds(workers.pid), "cpu_ms_per_job": cpu_ms,
                "version": importlib.metadata.version("procrastinate")}


# The two statements the bare + SQL worker runs, taken from the platform at the start of its phase.
DURABLE_STATEMENTS = BASE_DIR / "var" / "bench-durable-statements.json"


@contextlib.contextmanager
def durable_worker(concurrency: int, redis_url: str) -> Iterator[tuple[subprocess.Popen, Any, Any]]:
    """The bare + SQL worker (bench/bare_durable.py) running, with the bench's copies of the
    platform's tables and the two statements taken from the platform: yields the worker, a
    connection, and a function counting the completed jobs.

    The copies are made once per run and keep their rows from one phase to the next, as the
    platform's tables keep its jobs (the bench's database is made afresh at the start of a run): a
    later round's floor runs on tables as full as the platform's, not on empty ones."""
    import psycopg

    from bench import bare_durable

    DURABLE_STATEMENTS.parent.mkdir(exist_ok=True)
    DURABLE_STATEMENTS.write_text(json.dumps(bare_durable.capture_statements()))
    dsn = os.environ["DATABASE_URL"]
    conn = psycopg.connect(dsn, autocommit=True)
    if conn.execute("SELECT to_regclass(%s)", [bare_durable.JOBS]).fetchone()[0] is None:
        bare_durable.create_tables(conn)
    # The platform's transport: no acknowledgement emulation (taskplatform/settings/base.py).
    env = {bare_durable.STATEMENTS_ENV: str(DURABLE_STATEMENTS), "BENCH_DURABLE_DSN": dsn, "BARE_ACK_EMULATION": "off"}
    try:
        with baseline_worker("bench.bare_durable", "durable", concurrency, redis_url, env) as worker:
            bare_durable.app.conf.broker_url = redis_url

            def completed() -> int:
                count_sql = f"SELECT count(*) FROM {bare_durable.JOBS} WHERE status = 'completed'"
                return conn.execute(count_sql).fetchone()[0]

            done = completed()
            bare_durable.submit(conn, 1)
            wait_for(lambda: completed() > done, 60, "the durable baseline's first job")
            yield worker, conn, completed
    finally:
        conn.close()


def handoff_phase(count: int, concurrency: int, redis_url: str) -> dict[str, Any]:
    """Celery's own hand-off, one message at a time to an idle bare worker (late acks, prefetch 1,
    the same concurrency): from just before `apply_async` to the task running (its first line,
    this host's clock). The part of answer→processing and wake→processing that is the substrate's:
    the platform's message takes the same way from Redis to a pool process."""
    import redis

    with baseline_worker("bench.bare_celery", "bare", concurrency, redis_url):
        from bench import bare_celery

        bare_celery.app.conf.broker_url = redis_url
        client = redis.Redis.from_url(redis_url)
        key = f"bench:handoff:{uuid.uuid4().hex[:8]}"
        delays = []
        for index in range(count + 5):
            time.sleep(0.02)  # idle between messages, as between two answers
            sent = time.time()
            bare_celery.stamp.apply_async(args=[key], queue="bare")
            reply = client.blpop([key], timeout=30)
            if reply is None:
                raise SystemExit("bench: the bare worker ran no stamp task within 30 s")
            if index >= 5:  # the first ones warm the pool processes
                delays.append((float(reply[1]) - sent) * 1000)
        client.delete(key)
        return summary_ms(delays)


START_TRIES = 7  # starts of each process in the start phase


def start_phase(shipped: Platform, tries: int) -> dict[str, Any]:
    """A process's start, `tries` times each, alternating, from spawn to exit: `manage.py submit
    demo.noop --count 1` as `make run` would run it (the platform phase's submitter, with one job),
    and a bare Django + Celery process doing the least a submitter must (`bench/bare_start.py`).
    The platform phase's window opens with the first one's start, so its "first claim after" is
    mostly this; the bare one is the substrate's part of it."""
    import redis

    queue = f"bench-start-{uuid.uuid4().hex[:8]}"
    commands = {
        "platform": ([str(RUN_BIN / "python"), "manage.py", "submit", "demo.noop", "--count", "1"], shipped.env),
        "bare": ([str(RUN_BIN / "python"), "bench/bare_start.py"], {**os.environ, "BARE_START_QUEUE": queue}),
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(tries):
        for name, (argv, env) in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run(argv, cwd=BASE_DIR, env=env, capture_output=True, text=True)
            seconds[name].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if done.returncode:
                raise SystemExit(f"bench: {' '.join(argv[1:])} failed: {done.stderr[-2000:]}")
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.delete(queue, f"_kombu.binding.{queue}")
    client.close()
    return {name: {"tries": tries, "median_s": round(statistics.median(seconds[name]), 3),
                   "min_s": round(min(seconds[name]), 3), "cpu_median_s": round(statistics.median(cpu[name]), 3)}
            for name in commands}


def durable_tables_drop() -> None:
    """The end of a run: the bench's copies of the platform's tables go (`durable_worker`)."""
    import psycopg

    from bench import bare_durable

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {bare_durable.EVENTS}, {bare_durable.JOBS}")


def durable_phase(count: int, concurrency: int, redis_url: str, profile_dir: Path | None = None,
                  waits_dsn: str | None = None) -> dict[str, Any]:
    """bare Celery plus the platform's own SQL per job (bench/bare_durable.py), until the bench's
    copy of the jobs table says all N are completed. With `profile_dir`, its worker is sampled as
    the platform's is (`durable_worker.txt`): the two side by side; with `waits_dsn`, what its
    statements waited for in PostgreSQL (`PgWaits`)."""
    from bench import bare_durable

    with durable_worker(concurrency, redis_url) as (worker, conn, completed):
        vacuumed(conn, bare_durable.JOBS, bare_durable.EVENTS)
        scans = TableScans(conn, bare_durable.JOBS)
        profile = Profile(None, "durable", max(5.0, count / 600), profile_dir, name="durable_worker", pid=worker.pid)
        budget = CpuBudget(worker.pid)
        budget.start()
        done = completed()
        since, started = datetime.now(UTC), time.perf_counter()
        with PgWaits(waits_dsn) as waits:
            ids = bare_durable.submit(conn, count)
            submitted = time.perf_counter() - started
            wait_for(lambda: completed() >= done + count, 600, f"{count} durable baseline jobs", interval=0.25)
            seconds = time.perf_counter() - started
        cpu_ms = budget.stop(count)
        first, last = conn.execute(f"SELECT min(started_at), max(finished_at) FROM {bare_durable.JOBS} "
                                   "WHERE id = ANY(%s::uuid[])", [ids]).fetchone()
        return {"count": count, **window_figures(count, seconds, since, last),
                "submit_seconds": round(submitted, 3), **drain_figures(count, since, first, last),
                "worker_cpu_seconds_with_start": tree_cpu_seconds(worker.pid), "cpu_ms_per_job": cpu_ms,
                "statements": json.loads(DURABLE_STATEMENTS.read_text()), "scans": scans.stop(),
                "profile_worker": profile.top(), "pg_waits": waits.summary()}


def window_figures(count: int, polled: float, since: datetime, last: datetime | None) -> dict[str, Any]:
    """A durable phase's window, from `since` (taken as it began) to `last`, when its last job
    finished as its own row says (the database's clock, the same host's), and its rate. The bench
    looks at the rows every quarter of a second, so the moment it saw them all (`seconds_polled`)
    is later by up to that much, 0.125 s on average: about 2 % of a 3,000-job window, where bare
    Celery's counter is looked at every 20 ms. Without a row's time, the polled one."""
    exact = (last - since).total_seconds() if last is not None else None
    seconds = exact if exact is not None and 0 < exact <= polled else polled
    return {"seconds": round(seconds, 3), "per_second": round(count / seconds, 1), "seconds_polled": round(polled, 3)}


def drain_figures(count: int, since: datetime, first: datetime | None, last: datetime | None) -> dict[str, Any]:
    """When the worker claimed the first job and finished the last, from the rows, and the rate in
    between: the worker's own pace, apart from the submission that the run's rate includes."""
    if first is None or last is None:
        return {}
    drain = (last - first).total_seconds()
    return {"first_claim_after_s": round((first - since).total_seconds(), 3), "drain_seconds": round(drain, 3),
            "drain_per_second": round(count / drain, 1) if drain > 0 else None}


def platform_phase(count: int, shipped: Platform, profile_dir: Path | None = None,
                   waits_dsn: str | None = None) -> dict[str, Any]:
    """`manage.py submit demo.noop --count N`, until the database says all are completed. With
    `waits_dsn`, what its statements waited for in PostgreSQL (`PgWaits`)."""
    from django.db import connection
    from django.db.models import Max, Min

    from jobs.models import Job, JobEvent

    with connection.cursor() as cursor:
        vacuumed(cursor, Job._meta.db_table, JobEvent._meta.db_table)
    scans = TableScans(connection, Job._meta.db_table)
    profile = Profile(shipped, "worker", max(5.0, count / 400), profile_dir)
    cpu_before = shipped.cpu_by_service()
    budget = CpuBudget(shipped.service_pid("worker"))
    budget.start()
    since, started = datetime.now(UTC), time.perf_counter()
    with PgWaits(waits_dsn) as waits:
        submit = subprocess.run([str(RUN_BIN / "python"), "manage.py", "submit", "demo.noop", "--count", str(count)],
                                cwd=BASE_DIR, env=shipped.env, capture_output=True, text=True)
        if submit.returncode:
            raise SystemExit(f"bench: manage.py submit failed: {submit.stderr[-2000:]}")
        submitted = time.perf_counter() - started
        ids = submit.stdout.split()
        rss_peak = shipped.rss_mb()

        def done() -> bool:
            nonlocal rss_peak
            rss_peak = max(rss_peak, shipped.rss_mb())
            finished = Job.objects.filter(created_at__gte=since, kind="demo.noop", status__in=["completed", "failed"])
            return finished.count() >= len(ids)

        wait_for(done, 900, f"{count} platform jobs", interval=0.25)
        seconds = time.perf_counter() - started
    cpu_ms = budget.stop(len(ids))
    ran = Job.objects.filter(created_at__gte=since, kind="demo.noop")
    failed = ran.filter(status="failed").count()
    span = ran.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return {"count": len(ids), **window_figures(len(ids), seconds, since, span["last"]),
            "submit_seconds": round(submitted, 3), **drain_figures(len(ids), since, span["first"], span["last"]),
            "failed": failed, "rss_under_load_mb": rss_peak,
            "cpu_seconds": cpu_delta(cpu_before, shipped.cpu_by_service()), "cpu_ms_per_job": cpu_ms,
            "profile_worker": profile.top(), "scans": scans.stop(), "pg_waits": waits.summary()}


class _ApiConnection(asyncio.Protocol):
    """One keep-alive connection sending the same pre-encoded `POST /api/jobs/` until the deadline.

    The load generator shares the machine's cores with the server, so it has to cost them little:
    the request's bytes are built once, and each response is parsed by httptools (the C parser
    uvicorn itself uses). httpx spent about 4 ms of CPU per request here, a third of the server's.

    Paced (`first_due`, `interval`): the connection's requests fall due at `first_due` and every
    `interval` seconds after, each sent at its due time or, when the one before it came back
    late, as soon as it did; its time is counted from its due time, not from its send, so that a
    server falling behind shows in the figure instead of slowing the load (coordinated omission).
    """

    def __init__(self, request: bytes, deadline: float, latencies: list[float], errors: dict[str, int],
                 done: asyncio.Future, slow: list[tuple[float, float]], first_due: float = 0.0,
                 interval: float = 0.0) -> None:
        import httptools

        self.request, self.deadline, self.latencies, self.errors, self.done, self.slow = (
            request, deadline, latencies, errors, done, slow)
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent = 0.0
        self.due, self.interval = first_due, interval

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        now = time.perf_counter()
        if max(now, self.due) >= self.deadline:
            self.transport.close()
            return
        if self.interval:
            if now < self.due:
                asyncio.get_running_loop().call_later(self.due - now, self.send)
                return
            self.sent, self.due = self.due, self.due + self.interval
        else:
            self.sent = now
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        status = str(self.parser.get_status_code())
        if status == "201":
            took = (time.perf_counter() - self.sent) * 1000
            self.latencies.append(took)
            if took > SLOW_REQUEST_MS:
                self.slow.append((self.sent, took))
        else:
            self.errors[status] = self.errors.get(status, 0) + 1
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
        if not self.done.done():
            self.done.set_result(None)


async def api_clients(url: str, tokens: list[str], seconds: float, clients: int,
                      path: str = "/api/jobs/", rate: float = 0.0) -> dict[str, Any]:
    """`clients` keep-alive connections sending for `seconds`: each as fast as its answers come
    or, with `rate`, paced to `rate` requests a second in all, spread evenly (`_ApiConnection`)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    body = json.dumps({"kind": "demo.noop", "input": {}}).encode()

    def request(token: str) -> bytes:
        return (f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Token {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    latencies: list[float] = []
    slow: list[tuple[float, float]] = []
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    began = time.perf_counter()
    if rate:  # every connection made before the first request falls due; the window from then on
        began += 0.05
    deadline = began + seconds
    finished = []
    for index in range(clients):
        done = loop.create_future()
        own = request(tokens[index % len(tokens)])
        pacing = (began + index / rate, clients / rate) if rate else (0.0, 0.0)
        await loop.create_connection(
            lambda done=done, own=own, pacing=pacing: _ApiConnection(own, deadline, latencies, errors, done, slow,
                                                                     *pacing),
            parts.hostname, parts.port)
        finished.append(done)
    await asyncio.gather(*finished)
    elapsed = time.perf_counter() - began
    # perf_counter is the system's monotonic clock: the bench process compares these windows with
    # its commit probe's.
    return {"requests": len(latencies), "seconds": round(elapsed, 2),
            "per_second": round(len(latencies) / elapsed, 1), **summary_ms(latencies), "errors": errors,
            "slow_windows": slow, "latencies": [round(ms, 2) for ms in latencies]}


def api_clients_run(url: str, tokens: list[str], seconds: float, clients: int, env: dict[str, str],
                    path: str = "/api/jobs/", rate: float = 0.0) -> dict[str, Any]:
    """`api_clients` in a process of their own (their CPU is not the server's GIL): its figures."""
    with CommitProbe(os.environ["DATABASE_URL"]) as probe:
        out = subprocess.run([sys.executable, __file__, "--api-client", url, ",".join(tokens), str(seconds),
                              str(clients), path, str(rate)], cwd=BASE_DIR, capture_output=True, text=True,
                             env=env)
    if out.returncode:
        raise SystemExit(f"bench: the API clients failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # The requests over SLOW_REQUEST_MS, and how many of them waited as long as a commit of the
    # probe's: a stall of PostgreSQL's commit (the disk) at the same moment.
    slow = result.pop("slow_windows")
    stalled = sum(1 for sent, took in slow if probe.worst_ms(sent, sent + took / 1000) > SLOW_REQUEST_MS)
    result["over_slow_ms"] = {"requests": len(slow), "during_a_commit_stall": stalled}
    result["commits_ms"] = probe.took_ms()  # the figures are over a side's slices (`_ApiSide.result`)
    return result


def connections_per_web_process(server_pid: int, port: int) -> list[int]:
    """How many established connections to `port` each web process (a child of the server's main
    process, multiprocessing's resource tracker aside) holds, most first. The web processes share
    one listening socket, and which one accepts a connection is up to the kernel's wake-ups."""
    import psutil

    counts = []
    try:
        for child in psutil.Process(server_pid).children():
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
            counts.append(sum(1 for each in child.net_connections("tcp")
                              if each.status == psutil.CONN_ESTABLISHED and each.laddr.port == port))
    except psutil.NoSuchProcess:
        return []
    return sorted(counts, reverse=True)


# The API's figure and its floor's are each taken in this many slices, the two alternating.
API_SLICES = 4


class _ApiSide:
    """One side of the API's comparison (`api_phase`): its slices' figures, added up."""

    name = ""
    path = "/api/jobs/"
    rate = 0.0  # requests a second in all, paced (`api_clients`); 0: as fast as the answers come

    def __init__(self, tokens: list[str], clients: int, url: str = "", env: dict[str, str] | None = None) -> None:
        self.tokens, self.clients, self.url, self.env = tokens, clients, url, env or {}
        self.latencies: list[float] = []
        self.commits: list[float] = []
        self.errors: dict[str, int] = {}
        self.slow = {"requests": 0, "during_a_commit_stall": 0}
        self.cpu: dict[str, float] = {}
        self.seconds = 0.0
        self.slices: list[dict[str, Any]] = []
        self.profiles: dict[str, Any] = {}

    def settle(self) -> None:
        """Wait until the jobs this side's requests submitted have run."""

    def unfinished(self) -> int | None:
        """How many of this side's jobs have not finished yet (None: not counted)."""
        return None

    def cpu_now(self) -> dict[str, float]:
        return {}

    def profiling(self, seconds: float, profile_dir: Path) -> list[tuple[str, Profile]]:
        return []

    def warm(self) -> None:
        """Each web process's first requests (imports, connections, kept statements), untimed."""
        api_clients_run(self.url, self.tokens, 2.0, self.clients, self.env, self.path)

    def web_server_pid(self) -> int | None:
        """The web server's main process (its web processes are its children)."""
        return None

    def run_slice(self, seconds: float, profile_dir: Path | None) -> None:
        cpu_before = self.cpu_now()
        clients_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        profiles = self.profiling(seconds * 0.8, profile_dir) if profile_dir is not None else []
        # Counted once the clients have connected (they keep their connections for the slice).
        spread: list[int] = []
        server_pid, port = self.web_server_pid(), int(self.url.rsplit(":", 1)[1])
        counting = threading.Timer(min(1.0, seconds / 4),
                                   lambda: spread.extend(connections_per_web_process(server_pid, port)))
        if server_pid is not None:
            counting.start()
        result = api_clients_run(self.url, self.tokens, seconds, self.clients, self.env, self.path, self.rate)
        counting.cancel()  # a slice shorter than the wait: nothing counted
        if server_pid is not None:
            counting.join()  # a count under way ends first
        clients_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        for name, spent_now in cpu_delta(cpu_before, self.cpu_now()).items():
            self.cpu[name] = round(self.cpu.get(name, 0.0) + spent_now, 2)
        # The load generator's own CPU: on one machine it competes with the server for the cores.
        self.cpu["clients"] = round(self.cpu.get("clients", 0.0) + clients_after.ru_utime + clients_after.ru_stime
                                    - clients_before.ru_utime - clients_before.ru_stime, 2)
        for key, profile in profiles:
            self.profiles[key] = profile.top()
        self.latencies += result["latencies"]
        self.commits += result["commits_ms"]
        for error, count in result["errors"].items():
            self.errors[error] = self.errors.get(error, 0) + count
        for key in self.slow:
            self.slow[key] += result["over_slow_ms"][key]
        self.seconds += result["seconds"]
        # Whether the workers ran the jobs as they came, or queued them: the jobs not finished when
        # the clients stop, and how long until they are (the CPU above is the clients' window only).
        left = self.unfinished()
        began = time.perf_counter()
        self.settle()
        self.slices.append({"per_second": result["per_second"], "p50": result["p50"], "p99": result["p99"],
                            "connections_per_web_process": spread, "jobs_left": left,
                            "drained_in_s": round(time.perf_counter() - began, 2)})

    def result(self) -> dict[str, Any]:
        return {"requests": len(self.latencies), "seconds": round(self.seconds, 2),
                "per_second": round(len(self.latencies) / self.seconds, 1), **summary_ms(self.latencies),
                "errors": self.errors, "over_slow_ms": self.slow, "commit_probe_ms": commits_summary(self.commits),
                "cpu_seconds": self.cpu, "slices": self.slices, **self.profiles}


class _PlatformApi(_ApiSide):
    """`POST /api/jobs/` on `make run`'s web processes, the platform's worker running the jobs."""

    name = "api"

    def __init__(self, shipped: Platform, tokens: list[str], clients: int) -> None:
        super().__init__(tokens, clients, shipped.url, shipped.env)
        self.shipped = shipped

    def settle(self) -> None:
        drained()

    def unfinished(self) -> int | None:
        return unfinished_jobs()

    def web_server_pid(self) -> int | None:
        return self.shipped.service_pid("web")

    def cpu_now(self) -> dict[str, float]:
        return self.shipped.cpu_by_service()

    def profiling(self, seconds: float, profile_dir: Path) -> list[tuple[str, Profile]]:
        # The worker too: here the jobs come one at a time, not in a queued batch.
        return [("profile_web", Profile(self.shipped, "web", seconds, profile_dir)),
                ("profile_worker", Profile(self.shipped, "worker", seconds, profile_dir, name="api_worker"))]


class _FloorApi(_ApiSide):
    """The API's floor, beside the platform's (running, idle meanwhile): `POST /bench/floor/`
    (bench/api_urls.py: the API's authentication, throttle, parser and renderer, one INSERT of the
    job and its event, Celery's message) served by `make run`'s web command line with the bench's
    URLconf, as many processes, while the bare + SQL worker runs the platform's two statements for
    each submitted job, as the platform's worker runs them for the API's. A context manager: the
    server and the worker stop at its end."""

    name = "api-floor"
    path = "/bench/floor/"

    def __init__(self, shipped: Platform, tokens: list[str], clients: int, concurrency: int, redis_url: str) -> None:
        super().__init__(tokens, clients)
        self.shipped, self.concurrency, self.redis_url = shipped, concurrency, redis_url
        self.stack = contextlib.ExitStack()
        self.jobs_run = 0

    def __enter__(self) -> _FloorApi:
        from devtools.supervisor import build_services, port_open

        self.worker, self.conn, self.completed = self.stack.enter_context(
            durable_worker(self.concurrency, self.redis_url))
        port = free_port()
        self.env = {**self.shipped.env, "DJANGO_SETTINGS_MODULE": "bench.api_settings", "PORT": str(port),
                    "BARE_CELERY_BROKER": self.redis_url}
        web = next(service for service in build_services(self.env) if service.name == "web")
        # From the virtualenv the platform's processes run from (build_services names this one's).
        argv = [str(RUN_BIN / Path(web.argv[0]).name), *web.argv[1:]]
        self.server = subprocess.Popen(argv, cwd=BASE_DIR, env=self.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        self.stack.callback(self._stop_server)
        self.url = f"http://127.0.0.1:{port}"
        wait_for(lambda: port_open("127.0.0.1", port), 60, "the floor's web server")
        return self

    def _stop_server(self) -> None:
        os.killpg(self.server.pid, signal.SIGTERM)
        self.server.wait(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def settle(self) -> None:
        wait_for(lambda: self.unfinished() == 0, 300, "the floor's jobs finishing", interval=0.2)

    def unfinished(self) -> int | None:
        from bench import bare_durable

        return self.conn.execute(f"SELECT count(*) FROM {bare_durable.JOBS} WHERE status <> 'completed'").fetchone()[0]

    def cpu_now(self) -> dict[str, float]:
        # PostgreSQL and Redis as the platform's side counts them (`Platform.cpu_by_service`): the
        # platform's processes are idle meanwhile, but for beat's passes.
        return {"web": tree_cpu_seconds(self.server.pid), "worker": tree_cpu_seconds(self.worker.pid),
                **servers_cpu_seconds()}

    def web_server_pid(self) -> int | None:
        return self.server.pid

    def profiling(self, seconds: float, profile_dir: Path) -> list[tuple[str, Profile]]:
        return [("profile_web", Profile(None, "web", seconds, profile_dir, name="api_floor_web", pid=self.server.pid)),
                ("profile_worker", Profile(None, "worker", seconds, profile_dir, name="api_floor_worker",
                                           pid=self.worker.pid))]

    def run_slice(self, seconds: float, profile_dir: Path | None) -> None:
        done_before = self.completed()
        super().run_slice(seconds, profile_dir)
        self.settle()
        self.jobs_run += self.completed() - done_before

    def result(self) -> dict[str, Any]:
        return {**super().result(), "jobs_run_during": self.jobs_run}


def slices_text(side: dict[str, Any]) -> str:
    return ", ".join(f"{each['per_second']} / {each['p99']}"
                     + (f" ({'/'.join(map(str, each['connections_per_web_process']))})"
                        if len(each.get("connections_per_web_process") or ()) > 1 else "")
                     + (f" [{each['jobs_left']} jobs left, {each['drained_in_s']:g} s]"
                        if each.get("jobs_left") is not None else "")
                     for each in side.get("slices", []))


def api_phase(shipped: Platform, tokens: list[str], seconds: float, clients: int, sides: set[str],
              concurrency: int, redis_url: str, slices: int = API_SLICES,
              profile_dir: Path | None = None, rate: float = 0.0) -> dict[str, dict[str, Any]]:
    """`POST /api/jobs/` (side "api") and its floor (side "api-floor": `_FloorApi`), `clients`
    keep-alive clients in a process of their own (their CPU is not the server's GIL) for `seconds`
    each, in `slices` slices, the sides alternating (the platform, the floor, the floor, the
    platform, ...) with their jobs run between two slices: the machine's speed moves by the minute,
    and one 20-second phase after the other met different minutes (the platform 20 requests a
    second above its floor in one run and 60 under it in the next, 2026-12-06). Each client sends
    with a token of its own (`client_keys`), as separate integrations do: the per-token rate limit
    (API_THROTTLE_RATE, 6,000 a minute) is then each client's, not the bench's. Each side's
    figures are over all its slices (`slices` lists each one's); the profiles, of its first. With
    `rate`, both sides' clients are paced to that many requests a second in all, each request timed
    from when it fell due (`_ApiConnection`): the latency at that load rather than at the most the
    server takes."""
    with contextlib.ExitStack() as stack:
        runners: list[_ApiSide] = []
        if "api" in sides:
            runners.append(_PlatformApi(shipped, tokens, clients))
        if "api-floor" in sides:
            drained()  # the platform's worker done with earlier jobs: its CPU is not in the floor's figure
            runners.append(stack.enter_context(_FloorApi(shipped, tokens, clients, concurrency, redis_url)))
        for runner in runners:
            runner.rate = rate
            runner.warm()
        for runner in runners:  # no side's jobs still running in the other's slice (each slice settles its own)
            runner.settle()
        for index in range(slices):
            for runner in runners if index % 2 == 0 else runners[::-1]:
                runner.run_slice(seconds / slices, profile_dir if index == 0 else None)
        return {runner.name: runner.result() for runner in runners}


def api_line(name: str, side: dict[str, Any], rate: float) -> str:
    """One side of the API phase (`api_phase`) as the run prints it."""
    paced = f" (paced to {rate:g} req/s, each timed from when it fell due)" if rate else ""
    floor = (" (bare DRF + one INSERT + Celery's message, the bare + SQL worker running them: "
             f"{side['jobs_run_during']} run)") if "jobs_run_during" in side else ""
    per_request = {part: round(seconds * 1000 / max(side["requests"], 1), 2) for part, seconds in
                   side["cpu_seconds"].items()}
    return (f"  {name:<16} {side['per_second']:8.1f} req/s  p50 {side['p50']} ms  p99 {side['p99']} ms{paced}  "
            f"errors {side['errors']}  cpu ms a request {per_request}  over {SLOW_REQUEST_MS:.0f} ms "
            f"{side['over_slow_ms']}, commits meanwhile {side['commit_probe_ms']}{floor}  "
            f"slices (req/s / p99 ms (connections held by each web process) [jobs not finished when the clients "
            f"stopped, seconds until they were]): {slices_text(side)}")


def processing_after(job_id: Any, sent: datetime) -> tuple[float, Any]:
    """Milliseconds from `sent` to the `created_at` of the job's first `processing` event after
    it (its row), and that row."""
    from jobs.models import JobEvent

    event = wait_for(lambda: JobEvent.objects.filter(job_id=job_id, type="status", status="processing",
                                                     created_at__gt=sent).order_by("seq").first(), 30,
                     "a job's processing event", interval=0.002)
    return (event.created_at - sent).total_seconds() * 1000, event


def client_keys(count: int) -> list[str]:
    """`count` API keys of the bench's reviewer, one for each API client."""
    from django.contrib.auth import get_user_model

    from accounts.services import api_token_create

    user = get_user_model().objects.get(username="bench-reviewer")
    return [api_token_create(user=user, name=f"bench client {index}")[1] for index in range(count)]


def watcher_key() -> str:
    """An API key of a staff user of the bench's own, who may watch every job."""
    from accounts.services import api_token_create, user_ensure

    user, _ = user_ensure(username="bench-watcher", superuser=True)
    return api_token_create(user=user, name="bench")[1]


class JobWatch:
    """One job's live stream, `/ws/jobs/{id}/`, followed as an API client does: a ticket asked for
    with an API key, then the websocket, whose first message is the job's snapshot."""

    def __init__(self, http: HttpConnection, base_url: str, key: str, job_id: Any) -> None:
        from websockets.sync.client import connect

        parts = urlsplit(base_url)
        status, body = http.post("/api/ws-tickets/", b"", {"Authorization": f"Token {key}"})
        if status != 201:
            raise SystemExit(f"bench: no websocket ticket: {status} {body[:200]!r}")
        ticket = json.loads(body)["ticket"]
        self._stack = contextlib.ExitStack()
        self.socket = self._stack.enter_context(
            connect(f"ws://{parts.netloc}/ws/jobs/{job_id}/?ticket={ticket}", open_timeout=10))
        self.event: dict[str, Any] = {}  # the last status event `status_received` matched
        first = json.loads(self.socket.recv(timeout=10))
        if first.get("type") != "snapshot":
            raise SystemExit(f"bench: the stream of job {job_id} began with {first!r}")

    def status_received(self, status: str, timeout: float = 30.0) -> float:
        """`time.perf_counter()` when the frame of the job's `status` event arrived."""
        deadline = time.perf_counter() + timeout
        while True:
            raw = self.socket.recv(timeout=max(deadline - time.perf_counter(), 0.001))
            received = time.perf_counter()
            message = json.loads(raw)
            event = message.get("event") or {}
            if message.get("type") == "event" and event.get("type") == "status" and event.get("status") == status:
                self.event = event
                return received

    def close(self) -> None:
        self._stack.close()


class HttpConnection:
    """A keep-alive HTTP/1.1 connection of the standard library: far less client work before the
    request's bytes leave than httpx's (which would count in the latencies timed from the send)."""

    def __init__(self, base_url: str) -> None:
        import http.client

        parts = urlsplit(base_url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        self.connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        response = self.connection.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.connection.close()


def resumes_timed(base_url: str, key: str, posts: list[tuple[Any, str, bytes, dict[str, str]]],
                  expect: int) -> dict[str, Any]:
    """`resumes_timed_probed` with PostgreSQL's commit latency probed meanwhile (`CommitProbe`)."""
    with CommitProbe(os.environ["DATABASE_URL"]) as probe:
        result = resumes_timed_probed(base_url, key, posts, expect, probe)
    return {**result, "commit_probe_ms": probe.summary()}


def resumes_timed_probed(base_url: str, key: str, posts: list[tuple[Any, str, bytes, dict[str, str]]],
                         expect: int, probe: CommitProbe) -> dict[str, Any]:
    """For each (job id, path, body, headers): watch the job's stream, POST, and time the POST's
    response and the `processing` event two ways: its frame's arrival on the job's websocket (the
    figure, as the issue defines it) and its row's `created_at` (`row_ms`: what this bench timed
    until 2026-12-02 11:30 UTC, the push to the socket not included)."""
    from concurrent.futures import ThreadPoolExecutor

    http = HttpConnection(base_url)
    # The socket is read in a thread of its own while this one waits for the POST's response: the
    # frame usually arrives first, and its time is taken as it arrives, not once the response is in.
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-watch")
    on_socket, rows, responses, sent_times, windows, unlike = [], [], [], [], [], []
    try:
        for job_id, path, body, headers in posts:
            watch = JobWatch(http, base_url, key, job_id)
            try:
                time.sleep(0.05)  # one at a time, as reviewers and callbacks come
                arrival = reader.submit(watch.status_received, "processing")
                sent_at = datetime.now(UTC)
                sent_times.append(sent_at)
                sent = time.perf_counter()
                status, answer = http.post(path, body, headers)
                responses.append((time.perf_counter() - sent) * 1000)
                windows.append((sent, time.perf_counter()))
                if status != expect:
                    raise SystemExit(f"bench: {path} refused: {status} {answer[:300]!r}")
                on_socket.append((arrival.result(timeout=35) - sent) * 1000)
            finally:
                watch.close()
            row_ms, row = processing_after(job_id, sent_at)
            rows.append(row_ms)
            # The frame timed is the row's own: the same number. Any other is a frame the job's
            # stream should not have sent then, and its time is not the resume's.
            if watch.event.get("seq") != row.seq:
                unlike.append({"job": str(job_id), "frame_seq": watch.event.get("seq"),
                               "frame_created_at": watch.event.get("created_at"), "row_seq": row.seq,
                               "row_created_at": row.created_at.isoformat(), "socket_ms": round(on_socket[-1], 1)})
    finally:
        reader.shutdown(wait=False, cancel_futures=True)
        http.close()
    # The slowest responses: their place in the run (a tail at the start is a cold path), when they
    # were sent, and the probe's slowest commit meanwhile (a tail that is the disk's).
    slowest = sorted(enumerate(responses), key=lambda item: -item[1])[:5]
    return {**summary_ms(on_socket), "response_ms": summary_ms(responses), "row_ms": summary_ms(rows),
            "frames_unlike_their_row": unlike,
            "slowest_responses": [{"index": index, "ms": round(ms, 1),
                                   "sent": sent_times[index].strftime("%H:%M:%S.%f")[:-3],
                                   "commit_probe_worst_ms": probe.worst_ms(*windows[index])}
                                  for index, ms in slowest]}


def unfinished_jobs() -> int:
    """How many of the platform's jobs are pending or running."""
    from jobs.models import Job

    return Job.objects.filter(status__in=[Job.Status.PENDING, Job.Status.PROCESSING]).count()


def drained() -> None:
    """Wait until no job is pending or running: a latency is not measured behind a backlog."""
    wait_for(lambda: unfinished_jobs() == 0, 300, "the earlier phases' jobs finishing", interval=0.2)


def broker_idle() -> None:
    """Wait until the workers' queue holds no message and none is being run: each paused review
    sends a notification task, and a hundred of them queued ahead of the first answer's message
    made that answer wait 170–670 ms (the max of every answer phase until 2026-12-03 11:50 UTC)."""
    import redis
    from django.conf import settings

    from jobs.broker import held_messages

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    queue = settings.CELERY_TASK_DEFAULT_QUEUE

    def idle() -> bool:
        # kombu keeps a queue's priorities in keys of their own, named after it.
        lists = [key for key in client.scan_iter(match=f"{queue}*") if client.type(key) == b"list"]
        # A delivered message is not in Redis: what the live workers hold is what they publish (jobs.broker).
        return not any(client.llen(key) for key in lists) and not held_messages()

    try:
        wait_for(idle, 120, "the workers' queue emptying", interval=0.1)
    finally:
        client.close()


def answer_phase(shipped: Platform, key: str, watcher: str, jobs: int,
                 profile_dir: Path | None = None) -> dict[str, Any]:
    """Answer paused `demo.review` jobs one at a time: answer POST → the `processing` event on the
    job's websocket."""
    drained()

    from approvals.models import Question
    from jobs.services import job_submit

    ids = [job_submit(kind="demo.review", input={"document": f"bench {i}"})[0].pk for i in range(jobs)]
    wait_for(lambda: Question.objects.filter(job_id__in=ids, status="open").count() == len(ids), 120,
             "the review jobs pausing on their questions", interval=0.2)
    broker_idle()
    body = json.dumps({"answer": {"approved": True}}).encode()
    posts = [(question.job_id, f"/api/questions/{question.pk}/answer/", body, {"Authorization": f"Token {key}"})
             for question in Question.objects.filter(job_id__in=ids, status="open")]
    # The web server while it answers (`--profile`): in `answer_web.txt`, its top frames in the results.
    profile = Profile(shipped, "web", jobs * 0.12, profile_dir, name="answer_web")
    return {**resumes_timed(shipped.url, watcher, posts, expect=200), "profile_web": profile.top()}


def wake_phase(shipped: Platform, watcher: str, jobs: int) -> dict[str, Any]:
    """Wake parked `demo.generate` jobs one at a time: callback POST → the `processing` event on
    the job's websocket."""
    drained()

    from demo.simulator import generation_get
    from jobs.services import job_submit
    from waits.models import Wait

    ids = [job_submit(kind="demo.generate", input={"prompt": f"p{i}", "delay": 0, "drop_callback": True})[0].pk
           for i in range(jobs)]
    wait_for(lambda: Wait.objects.filter(job_id__in=ids, job__status="waiting").count() == len(ids), 120,
             "the generate jobs parking", interval=0.2)
    broker_idle()
    posts = []
    for wait in Wait.objects.filter(job_id__in=ids):
        url = urlsplit(generation_get(wait.external_id)["callback_url"])
        posts.append((wait.job_id, urlunsplit(("", "", url.path, url.query, "")), b"", {}))
    return resumes_timed(shipped.url, watcher, posts, expect=202)


# --- One configuration --------------------------------------------------------------------------------


def _maintenance(url: str) -> tuple[Any, str]:
    """A connection to the server of `url` (its `postgres` database, autocommit) and `url`'s
    database name."""
    import psycopg

    parts = urlsplit(url)
    maintenance = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    return psycopg.connect(maintenance, autocommit=True), parts.path.lstrip("/")


def database_drop(url: str) -> None:
    """The database of `url` dropped, its connections closed."""
    from psycopg import sql

    conn, name = _maintenance(url)
    with conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def database_recreate(url: str) -> None:
    """The database of `url` dropped and made again, empty."""
    from psycopg import sql

    database_drop(url)
    conn, name = _maintenance(url)
    with conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def platform_env(*, worker_concurrency: int, web_concurrency: int | None) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "taskplatform.settings.development",
           "PORT": str(free_port()), "FLOWER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1",
           "WORKER_CONCURRENCY": str(worker_concurrency)}
    env["PUBLIC_URL"] = f"http://127.0.0.1:{env['PORT']}"
    if web_concurrency:
        env["WEB_CONCURRENCY"] = str(web_concurrency)
    return env


# The throughput phases, in the order each round runs them and the tables list them.
THROUGHPUT_ORDER = ("bare", "peer", "durable", "platform")
THROUGHPUT_PHASES = set(THROUGHPUT_ORDER)


def throughput_round(args: argparse.Namespace, shipped: Platform, worker_concurrency: int, phases: set[str],
                     index: int) -> dict[str, Any]:
    """The throughput phases once, one after the other (bare, bare + SQL, platform): their figures,
    the ratios, and the CPU budgets. Several rounds interleave them, so that a machine whose speed
    drifts during the run moves all three alike."""
    result: dict[str, Any] = {}
    if args.rounds > 1:
        print(f"  round {index + 1} of {args.rounds}", flush=True)
    if "bare" in phases:
        result["bare"] = bare_phase(args.count, worker_concurrency, os.environ["REDIS_URL"], args.bare_ack_emulation)
        print(f"  bare Celery   {result['bare']['per_second']:8.1f} tasks/s  (worker cpu "
              f"{result['bare']['worker_cpu_seconds_with_start']} s; ack emulation {args.bare_ack_emulation})",
              flush=True)
    if "peer" in phases:
        result["peer"] = peer_phase(args.count, worker_concurrency, peer_database_url())
        peer = result["peer"]
        print(f"  Procrastinate {peer['per_second']:8.1f} jobs/s  (its {worker_concurrency} worker processes; "
              f"deferred in {peer['submit_seconds']} s, drained at {peer.get('drain_per_second')}/s, worker cpu "
              f"{peer['worker_cpu_seconds_with_start']} s)", flush=True)
    if "durable" in phases:
        result["durable"] = durable_phase(args.count, worker_concurrency, os.environ["REDIS_URL"], args.profile,
                                          waits_dsn(args))
        durable = result["durable"]
        print(f"  bare + SQL    {durable['per_second']:8.1f} jobs/s  (the platform's two statements per job, "
              f"no Django; submitted in {durable['submit_seconds']} s, drained at "
              f"{durable.get('drain_per_second')}/s, worker cpu {durable['worker_cpu_seconds_with_start']} s"
              f"{scans_text(durable.get('scans'))})", flush=True)
        if waits := pg_waits_text(durable.get("pg_waits")):
            print(f"                {waits}", flush=True)
    if "platform" in phases:
        result["platform"] = platform_phase(args.count, shipped, args.profile, waits_dsn(args))
        run = result["platform"]
        print(f"  platform      {run['per_second']:8.1f} jobs/s  (submitted in {run['submit_seconds']} s, "
              f"first claim after {run.get('first_claim_after_s')} s, drained at {run.get('drain_per_second')}/s"
              f"{scans_text(run.get('scans'))})  cpu {run['cpu_seconds']}", flush=True)
        if waits := pg_waits_text(run.get("pg_waits")):
            print(f"                {waits}", flush=True)
    if "bare" in result and "platform" in result:
        result["ratio"] = round(result["platform"]["per_second"] / result["bare"]["per_second"], 3)
        drained = result["platform"].get("drain_per_second")
        if drained:
            # The worker's pace once the submitter's process has started (its first claim to its last job).
            result["drain_ratio"] = round(drained / result["bare"]["per_second"], 3)
        polled = result["platform"].get("seconds_polled")
        at_poll = round(result["platform"]["count"] / polled / result["bare"]["per_second"], 3) if polled else None
        print(f"  ratio         {result['ratio']:8.3f}  (drained × bare Celery: {result.get('drain_ratio')}; "
              f"to the quarter-second poll that saw the last job: {at_poll})", flush=True)
    if "bare" in result and "peer" in result:
        result["peer_ratio"] = round(result["peer"]["per_second"] / result["bare"]["per_second"], 3)
    if "bare" in result and "durable" in result:
        result["floor_ratio"] = round(result["durable"]["per_second"] / result["bare"]["per_second"], 3)
    if "durable" in result and "platform" in result:
        result["platform_over_floor"] = round(result["platform"]["per_second"] / result["durable"]["per_second"], 3)
    for line in budget_lines(result):
        print(f"  {line}", flush=True)
    return result


def waits_dsn(args: argparse.Namespace) -> str | None:
    """The database whose backends `--pg-waits` reads, or None without it."""
    return os.environ["DATABASE_URL"] if args.pg_waits else None


def tables_warm(args: argparse.Namespace, shipped: Platform, worker_concurrency: int, phases: set[str]) -> None:
    """One untimed pass of N jobs through the floor's and the platform's tables before the first
    round, as `peer_prepare` gives Procrastinate's: every durable phase then starts on tables in
    use, as a busy queue's are.

    Without it the platform's first round ran on a poor plan. Each event's foreign key is checked
    by PostgreSQL with a query whose plan a connection keeps, and the platform's processes (started
    once a run) made it while the jobs table held a row or two: a sequential scan. The phase's
    `VACUUM ANALYZE` found the same one row and page, so nothing told the connections to plan
    again, and the round's 9,003 checks read 15.3 million rows, 0.040 ms each against the floor's
    0.003 (pg_stat_statements, 2026-12-05 01:31 UTC; the floor's worker starts afresh each round
    and planned on the growing table). The second round's `VACUUM ANALYZE` saw thousands of rows
    and the plans were made again: the platform's first round was its slowest in every run of
    2026-12-04 (337.0 against 385.5 and 426.0 jobs a second at 00:27 UTC)."""
    if not phases & THROUGHPUT_PHASES or args.rounds < 1 or args.cold:
        return
    if "durable" in phases:
        durable_phase(args.count, worker_concurrency, os.environ["REDIS_URL"])
    if "platform" in phases:
        platform_phase(args.count, shipped)
    print(f"  warmed: {args.count} untimed jobs through the floor's and the platform's tables", flush=True)


def round_summary(round_: dict[str, Any]) -> dict[str, Any]:
    """One round's rates, ratios and CPU per job, for the results' list of rounds."""
    summary: dict[str, Any] = {}
    for key in THROUGHPUT_ORDER:
        if key in round_:
            summary[key] = round_[key]["per_second"]
            summary[f"{key}_cpu_ms_per_job"] = round_[key].get("cpu_ms_per_job", {}).get("total")
    for key in ROUND_RATIOS:
        if key in round_:
            summary[key] = round_[key]
    return summary


def run_configuration(args: argparse.Namespace, *, worker_concurrency: int, web_concurrency: int | None,
                      phases: set[str]) -> dict[str, Any]:
    import redis

    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    database_recreate(os.environ["DATABASE_URL"])
    if "peer" in phases:
        peer_prepare(peer_database_url(), warm_jobs=args.count, concurrency=worker_concurrency)
    env = platform_env(worker_concurrency=worker_concurrency, web_concurrency=web_concurrency)
    os.environ["PUBLIC_URL"] = env["PUBLIC_URL"]
    shipped = Platform(env)
    from devtools.supervisor import web_processes

    result: dict[str, Any] = {"worker_concurrency": worker_concurrency, "web_concurrency": web_processes(env),
                              "worker_nice": nice_value(env.get("WORKER_NICE"))}
    try:
        shipped.start()
        from django.db import connections

        connections.close_all()
        result["rss_idle_mb"] = shipped.rss_mb()
        token = subprocess.run([sys.executable, "manage.py", "create_api_token", "bench-reviewer", "--create",
                                "--reviewer"], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1]
        tables_warm(args, shipped, worker_concurrency, phases)
        rounds = [throughput_round(args, shipped, worker_concurrency, phases, index)
                  for index in range(args.rounds if phases & THROUGHPUT_PHASES else 0)]
        if rounds:
            # The round with the median ratio stands for the run; with several, each is listed too.
            by_ratio = sorted(rounds, key=lambda each: each.get("ratio", each.get("platform_over_floor", 0.0)))
            result.update(by_ratio[(len(by_ratio) - 1) // 2])
        if len(rounds) > 1:
            result["rounds"] = [round_summary(each) for each in rounds]
            print(rounds_text(result["rounds"]), flush=True)
        api_profile = args.profile  # the first API phase run is sampled (its files would be the next's too)
        for suffix, rate in (("", 0.0), ("-paced", args.api_rate)):
            asked = {side for side in ("api", "api-floor") if side + suffix in phases}
            if not asked:
                continue
            sides = api_phase(shipped, client_keys(args.clients), args.api_seconds, args.clients, asked,
                              worker_concurrency, os.environ["REDIS_URL"], profile_dir=api_profile, rate=rate)
            api_profile = None
            for side, figures in sides.items():
                result[(side + suffix).replace("-", "_")] = figures
                print(api_line(side + suffix, figures, rate), flush=True)
        watcher = watcher_key() if phases & {"answer", "wake"} else ""
        if "answer" in phases:
            result["answer_to_processing_ms"] = answer_phase(shipped, token, watcher, args.resumes, args.profile)
            shown = {k: v for k, v in result["answer_to_processing_ms"].items() if k != "profile_web"}
            print(f"  answer→processing {shown}", flush=True)
        if "wake" in phases:
            result["wake_to_running_ms"] = wake_phase(shipped, watcher, args.resumes)
            print(f"  wake→running      {result['wake_to_running_ms']}", flush=True)
        if "handoff" in phases:
            result["handoff_ms"] = handoff_phase(args.resumes, worker_concurrency, os.environ["REDIS_URL"])
            print(f"  Celery's hand-off {result['handoff_ms']}  (bare Celery: apply_async → the task running, "
                  "an idle worker)", flush=True)
        if "start" in phases:
            result["start"] = start_phase(shipped, START_TRIES)
            start = result["start"]
            print(f"  a process's start: manage.py submit --count 1 {start['platform']['median_s']} s "
                  f"(CPU {start['platform']['cpu_median_s']} s); a bare Django + Celery process "
                  f"{start['bare']['median_s']} s (CPU {start['bare']['cpu_median_s']} s); medians of "
                  f"{START_TRIES}", flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        shipped.stop()
    return result


BUDGET_PARTS = {"celery_main": "the worker's main process (Celery's consumer)",
                "pool": "its pool processes (the tasks)", "postgres": "PostgreSQL", "redis": "Redis",
                "submitter": "the submitter", "total": "**all of them**"}


PHASE_NAMES = (("bare", "bare Celery"), ("peer", "Procrastinate"), ("durable", "bare + SQL"), ("platform", "platform"))


def budget_lines(run: dict[str, Any]) -> list[str]:
    """The throughput phases' CPU per job (`CpuBudget`), part by part, as a Markdown table."""
    phases = {name: run[key] for key, name in PHASE_NAMES if "cpu_ms_per_job" in run.get(key, {})}
    budgets = {name: phase["cpu_ms_per_job"] for name, phase in phases.items()}
    if not budgets:
        return []
    lines = ["| CPU ms per job | " + " | ".join(budgets) + " |", "|---|" + "---:|" * len(budgets)]
    for part, title in BUDGET_PARTS.items():
        lines.append(f"| {title} | " + " | ".join(f"{budget[part]:.2f}" for budget in budgets.values()) + " |")
    # All of them times the rate: how much of the machine the phase kept busy. Well under its
    # cores, the phase waited (commits, hand-offs) rather than ran out of CPU (bench/README.md).
    if all(phase.get("per_second") for phase in phases.values()):
        busy = [phase["cpu_ms_per_job"]["total"] * phase["per_second"] / 1000 for phase in phases.values()]
        lines.append(f"| cores busy (all of them × jobs/s), of {os.cpu_count()} | "
                     + " | ".join(f"{cores:.2f}" for cores in busy) + " |")
    if "Procrastinate" in budgets:
        lines += ["", "(Procrastinate's worker processes are its pool processes here; its main process is a parent "
                  "that only waits for them.)"]
    return lines


ROUND_COLUMNS = (("bare", "bare Celery /s"), ("peer", "Procrastinate /s"), ("durable", "bare + SQL /s"),
                 ("platform", "platform /s"), ("ratio", "platform × bare"), ("peer_ratio", "Procrastinate × bare"),
                 ("floor_ratio", "floor × bare"), ("platform_over_floor", "platform × floor"),
                 ("drain_ratio", "platform drained × bare"))
ROUND_RATIOS = ("ratio", "peer_ratio", "floor_ratio", "platform_over_floor", "drain_ratio")


def rounds_text(rounds: list[dict[str, Any]]) -> str:
    """The throughput rounds as a Markdown table (the columns that any round has), with the medians
    of their ratios."""
    columns = [(key, title) for key, title in ROUND_COLUMNS if any(key in each for each in rounds)]
    cpu_keys = [key for key in THROUGHPUT_ORDER if any(key in each for each in rounds)]
    lines = ["| round | " + " | ".join(title for _, title in columns) + " | CPU ms per job: "
             + ", ".join(dict(ROUND_COLUMNS)[key].removesuffix(" /s") for key in cpu_keys) + " |",
             "|---:|" + "---:|" * len(columns) + "---|"]
    for index, each in enumerate(rounds, 1):
        cpu = ", ".join(str(each.get(f"{key}_cpu_ms_per_job", "—")) for key in cpu_keys)
        lines.append(f"| {index} | " + " | ".join(str(each.get(key, "—")) for key, _ in columns) + f" | {cpu} |")
    medians = [str(round(statistics.median(each[key] for each in rounds), 3))
               if key in ROUND_RATIOS and all(key in each for each in rounds) else "" for key, _ in columns]
    lines.append("| median |" + "".join(f" {median} |" if median else " |" for median in medians) + " |")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    first = result["runs"][0]
    lines = [f"# The shipped configuration, {result['when']}", "",
             f"{result['machine']}; PostgreSQL and Redis on the same machine; `make run`'s processes "
             f"(development settings), worker concurrency {first['worker_concurrency']}, web processes "
             f"{first['web_concurrency'] or 'default'}, the workers (every side's) at nice "
             f"{first.get('worker_nice', 0)}; code {result['revision']}; the processes from "
             f"{result.get('venv', 'the development virtualenv')}.", "",
             "| figure | baseline, same run | ours | aim |", "|---|---|---|---|"]
    if "ratio" in first:
        lines.append(f"| no-op jobs end to end ({first['platform']['count']}) | bare Celery "
                     f"{first['bare']['per_second']}/s | {first['platform']['per_second']}/s = "
                     f"**{first['ratio']}×** | ≥ {AIMS['ratio']}× |")
    if "peer" in first:
        peer, bare = first["peer"], first.get("bare", {}).get("per_second")
        share = f" = {round(peer['per_second'] / bare, 3)}× bare Celery" if bare else ""
        platform = first.get("platform", {}).get("per_second")
        ours = f"{platform}/s = {round(platform / peer['per_second'], 3)}× of it" if platform else "—"
        lines.append(f"| the peer: Procrastinate {peer['version']}, {first['worker_concurrency']} worker processes, "
                     f"no broker ({peer['count']}) | {peer['per_second']}/s{share} | {ours} | ahead of its ratio |")
    if "durable" in first:
        durable, bare = first["durable"]["per_second"], first.get("bare", {}).get("per_second")
        share = f" = {round(durable / bare, 3)}× bare Celery" if bare else ""
        ours = (f"{first['platform']['per_second']}/s = {round(first['platform']['per_second'] / durable, 3)}× "
                "of it") if "platform" in first else "—"
        lines.append(f"| the substrate's floor: bare Celery + the platform's two statements per job "
                     f"({first['durable']['count']}) | {durable}/s{share} | {ours} | — |")
    if "api" in first:
        api, floor = first["api"], first.get("api_floor")
        baseline = (f"the floor (bare DRF view + one INSERT + Celery's message; bare + SQL worker): "
                    f"{floor['per_second']}/s, p50 {floor['p50']} ms, p99 {floor['p99']} ms") if floor else "—"
        lines.append(f"| `POST /api/jobs/`, {result['clients']} clients | {baseline} | **{api['per_second']}/s**, p50 "
                     f"{api['p50']} ms, p99 {api['p99']} ms | ≥ {AIMS['api_per_second']}/s, p99 ≤ "
                     f"{AIMS['api_p99_ms']} ms |")
    if "api_paced" in first:
        api, floor = first["api_paced"], first.get("api_floor_paced")
        baseline = (f"the floor, paced the same: {floor['per_second']}/s, p50 {floor['p50']} ms, p99 {floor['p99']} ms"
                    if floor else "—")
        lines.append(f"| `POST /api/jobs/`, {result['clients']} clients paced to {result['api_rate']:g} "
                     f"req/s in all, each request timed from when it fell due | {baseline} | {api['per_second']}/s, "
                     f"p50 {api['p50']} ms, **p99 {api['p99']} ms** | p99 ≤ {AIMS['api_p99_ms']} ms at "
                     f"{AIMS['api_per_second']}/s |")
    for key, title, aim in (("answer_to_processing_ms", "answer POST → processing event on the job's websocket",
                             f"p50 ≤ {AIMS['answer_p50_ms']}, p99 ≤ {AIMS['answer_p99_ms']} ms"),
                            ("wake_to_running_ms", "wake POST → processing event on the job's websocket",
                             f"p99 ≤ {AIMS['wake_p99_ms']} ms")):
        if key in first:
            row = first[key].get("row_ms")
            written = f" (its row written: p50 {row['p50']}, p99 {row['p99']} ms)" if row else ""
            if first[key].get("frames_unlike_their_row"):
                written += (f"; **{len(first[key]['frames_unlike_their_row'])} frame(s) timed were not their "
                            "row's event** (see the JSON)")
            lines.append(f"| {title} ({first[key]['n']}) | — | p50 {first[key]['p50']} ms, p99 {first[key]['p99']} ms"
                         f"{written} | {aim} |")
    if "handoff_ms" in first:
        handoff = first["handoff_ms"]
        lines.append(f"| Celery's hand-off: `apply_async` → the task running on an idle bare worker "
                     f"({handoff['n']}), the substrate's part of the two above | p50 {handoff['p50']} ms, "
                     f"p99 {handoff['p99']} ms | — | — |")
    if "start" in first:
        start = first["start"]
        lines.append(f"| a process's start, spawn to exit (median of {start['platform']['tries']}): `manage.py submit "
                     f"demo.noop --count 1` | a bare Django + Celery process, one statement and one message "
                     f"(`bench/bare_start.py`): {start['bare']['median_s']} s, CPU {start['bare']['cpu_median_s']} s"
                     f" | {start['platform']['median_s']} s, CPU {start['platform']['cpu_median_s']} s | — |")
    if "drain_ratio" in first:
        lines.append(f"| the platform's worker once the submitter has started (its first claim to its last job) | "
                     f"bare Celery {first['bare']['per_second']}/s | {first['platform']['drain_per_second']}/s = "
                     f"{first['drain_ratio']}× | — |")
    lines.append(f"| RSS of all the platform's processes | — | idle {first['rss_idle_mb']} MB, under load "
                 f"{first.get('platform', {}).get('rss_under_load_mb', '—')} MB | — |")
    if budget := budget_lines(first):
        lines += ["", *budget]
    if "rounds" in first:
        lines += ["", rounds_text(first["rounds"])]
    if len(result["runs"]) > 1:
        lines += ["", "| worker processes | web processes | bare Celery /s | Procrastinate /s | bare + SQL /s "
                  "| platform jobs/s | ratio | API req/s | API p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
        for run in result["runs"]:
            lines.append(f"| {run['worker_concurrency']} | {run['web_concurrency'] or 'default'} | "
                         f"{run.get('bare', {}).get('per_second', '—')} | "
                         f"{run.get('peer', {}).get('per_second', '—')} | "
                         f"{run.get('durable', {}).get('per_second', '—')} | "
                         f"{run.get('platform', {}).get('per_second', '—')} | {run.get('ratio', '—')} | "
                         f"{run.get('api', {}).get('per_second', '—')} | {run.get('api', {}).get('p99', '—')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="no-op tasks and jobs per throughput phase")
    parser.add_argument("--api-seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--api-rate", type=float, default=AIMS["api_per_second"],
                        help="the paced API phases' requests a second in all (api-paced, api-floor-paced)")
    parser.add_argument("--resumes", type=int, default=100, help="jobs answered, and jobs woken, one at a time")
    parser.add_argument("--concurrency", type=int, default=2, help="WORKER_CONCURRENCY of the main run")
    parser.add_argument("--phases", default="bare,peer,durable,platform,api,api-floor,api-paced,api-floor-paced,"
                                            "answer,wake,handoff,start")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the throughput phases this many times, interleaved; the round with the median "
                             "ratio stands for the run, and every round is listed")
    parser.add_argument("--cold", action="store_true",
                        help="no untimed pass before the first round: the first round runs on tables as a new "
                             "installation has them")
    parser.add_argument("--scale", action="store_true",
                        help="also throughput at 1, 2, 4 worker processes and the API at 1, 2, 4 web processes")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="sample the worker (platform phase; the floor's in its phase) and the web server "
                             "(API phase) with py-spy; collapsed stacks in DIR, the top frames in the results")
    parser.add_argument("--pg-waits", action="store_true",
                        help="read PostgreSQL's pg_stat_activity every 5 ms through the floor's and the platform's "
                             "phases: what the backends running the jobs' moves waited for (the log's flush, "
                             "another's flush, the CPU, the client)")
    parser.add_argument("--profile-wall", action="store_true",
                        help="with --profile: sample every thread, idle ones included (where the time goes, "
                             "not only the CPU)")
    parser.add_argument("--venv", choices=("run", "current"), default="run",
                        help="run: the measured processes run from a virtualenv of exactly what `make run` installs "
                             "(made under var/ by the Makefile's target); current: from this interpreter's")
    parser.add_argument("--bare-ack-emulation", choices=("on", "off"), default="on",
                        help="kombu's acknowledgement emulation in the bare Celery baseline: on, Celery's default "
                             "(the issue's baseline), or off, as the platform and the floor run")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    Profile.wall = args.profile_wall
    global RUN_BIN
    RUN_BIN = run_venv_made() if args.venv == "run" else VENV_BIN
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        raise SystemExit("bench: set DATABASE_URL (PostgreSQL; the database is dropped and made again) and REDIS_URL "
                         "(its database is flushed)")
    os.environ["DJANGO_SETTINGS_MODULE"] = "taskplatform.settings.development"
    os.environ["PYTHONPATH"] = str(BASE_DIR)
    import django

    database_recreate(os.environ["DATABASE_URL"])
    django.setup()

    phases = set(args.phases.split(","))
    runs = []
    print(f"main run: worker concurrency {args.concurrency}", flush=True)
    runs.append(run_configuration(args, worker_concurrency=args.concurrency, web_concurrency=None, phases=phases))
    if args.scale:
        for workers in (1, 2, 4):
            print(f"scale: {workers} worker processes", flush=True)
            runs.append(run_configuration(args, worker_concurrency=workers, web_concurrency=None,
                                          phases=THROUGHPUT_PHASES))
        for web in (1, 2, 4):
            print(f"scale: {web} web processes", flush=True)
            runs.append(run_configuration(args, worker_concurrency=args.concurrency, web_concurrency=web,
                                          phases={"api"}))
    durable_tables_drop()
    if "peer" in phases:
        database_drop(peer_database_url())
    result = {**run_header(), "clients": args.clients, "api_rate": args.api_rate, "count": args.count, "runs": runs,
              "venv": "make run's (requirements.lock, requirements-run.txt)" if args.venv == "run" else str(VENV_BIN)}
    text = markdown(result)
    print(text)
    if not args.no_write:
        results_save("shipped", result["when"], result, text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--api-client":
        url, tokens, seconds, clients = sys.argv[2], sys.argv[3].split(","), float(sys.argv[4]), int(sys.argv[5])
        path = sys.argv[6] if len(sys.argv) > 6 else "/api/jobs/"
        rate = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
        print(json.dumps(asyncio.run(api_clients(url, tokens, seconds, clients, path, rate))))
    else:
        sys.exit(main())
