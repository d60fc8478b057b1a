"""Throughput bench: bare Celery no-op tasks against the platform's `demo.noop` jobs, in one run.

    python bench/throughput.py [--count 2000] [--concurrency 2] [--repeat 1]

Both phases use one real Celery worker (prefork, the platform's settings: late acks, prefetch 1,
JSON) on the same broker and database:

1. bare celery: N `bench.noop` tasks sent with `apply_async`, timed from the first send until the
   worker has run all N (each task adds one to a Redis counter);
2. platform: N `demo.noop` jobs submitted as `manage.py submit --count N` does
   (`jobs_submit_many`, batches of 500), timed from the first submit until all N are `completed` in the database.

It prints a table, writes `bench/results/throughput-<UTC timestamp>.json` and rewrites
`bench/results/throughput-latest.md` (the newest result of each database and Redis setup).
Uses DATABASE_URL and REDIS_URL when set; else the embedded Redis and a SQLite file of its own
under var/. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script (`python bench/throughput.py`)
    sys.path.insert(0, str(BASE_DIR))

RESULTS_DIR = BASE_DIR / "bench" / "results"
BENCH_SQLITE = BASE_DIR / "var" / "bench.sqlite3"
WORKER_LOG = BASE_DIR / "var" / "bench-worker.log"
SUBMIT_BATCH = 500  # as `manage.py submit`: one transaction per 500 jobs
POLL_INTERVAL = 0.02  # seconds between two checks of the finish line, in both phases
WARMUP = 20  # tasks and jobs run before timing, so every pool process is connected and loaded
AIM = 0.5  # the platform should run at least half as many jobs per second as bare Celery runs tasks
WORKER_WARNING = re.compile(r": (WARNING|ERROR|CRITICAL)/")  # Celery's log format: `[date: LEVEL/process]`


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Measurement:
    phase: str  # "bare" or "platform"
    count: int
    seconds: float  # first send/submit until the last task/job is done
    enqueue_seconds: float  # first send/submit until the last one returned
    # CPU time per task/job: this process (sending, submitting, polling) and the worker's process
    # group (main process and pool); None where /proc is missing.
    bench_cpu_ms: float | None = None
    worker_cpu_ms: float | None = None
    warnings: int = 0  # warnings and errors logged meanwhile, by this process and by the worker

    @property
    def per_second(self) -> float:
        return self.count / self.seconds

    def as_dict(self) -> dict[str, Any]:
        values = {key: round(value, 3) if isinstance(value, float) else value for key, value in asdict(self).items()}
        return {**values, "per_second": round(self.per_second, 1)}


# --- Setup, before Django is configured ------------------------------------------------------------


def prepare_environment() -> dict[str, str]:
    """Fill in the environment the bench and its worker share; return what it describes.

    Called before Django reads its settings: REDIS_URL (else the embedded server), DATABASE_URL
    (else var/bench.sqlite3; a PostgreSQL database is created when missing) and a Redis key
    prefix of this run's own, so the bench never sees another worker's queue.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    # DEBUG makes Django record every SQL statement; measure what production runs.
    os.environ.setdefault("DJANGO_DEBUG", "false")
    redis_kind = "external"
    if not os.environ.get("REDIS_URL"):
        from devtools import embedded_redis

        os.environ["REDIS_URL"] = embedded_redis.start()
        redis_kind = "embedded"
    os.environ["REDIS_KEY_PREFIX"] = f"bench-{uuid.uuid4().hex[:8]}:"
    database_url = os.environ.get("DATABASE_URL")
    if not database_url:
        BENCH_SQLITE.parent.mkdir(parents=True, exist_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{BENCH_SQLITE}"
    elif urlsplit(database_url).scheme in {"postgres", "postgresql", "pgsql", "psql"}:
        postgres_database_ensure(database_url)
    return {"redis_kind": redis_kind, "redis_key_prefix": os.environ["REDIS_KEY_PREFIX"]}


def postgres_database_ensure(url: str) -> None:
    """Create the database that `url` names unless it exists (connecting to `postgres`)."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise BenchError("DATABASE_URL names no database")
    maintenance = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created PostgreSQL database {name!r}")


# --- The worker ----------------------------------------------------------------------------------


class Worker:
    """One real Celery worker in its own process group, its output in var/bench-worker.log."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        argv = [
            sys.executable, "-m", "celery", "-A", "taskplatform", "worker",
            "--loglevel", "INFO", "--pool", "prefork", "--concurrency", str(self.concurrency),
            "--without-mingle", "--without-gossip", "--hostname", f"bench-{os.getpid()}@%h",
            "--include", "bench.baseline_tasks",
        ]  # fmt: skip
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BASE_DIR), env.get("PYTHONPATH")]))
        WORKER_LOG.parent.mkdir(parents=True, exist_ok=True)
        with WORKER_LOG.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while " ready." not in self.output():
            if self.proc.poll() is not None:
                raise BenchError(f"the worker exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise BenchError(f"the worker was not ready within {timeout:.0f} s:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def output(self) -> str:
        try:
            return WORKER_LOG.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def warnings(self) -> list[str]:
        """The warning and error lines the worker has logged so far."""
        return [line for line in self.output().splitlines() if WORKER_WARNING.search(line)]

    def cpu_seconds(self) -> float | None:
        """CPU time of the worker's process group so far: the pool processes, and in the main
        process's children's time those it has already replaced (max tasks per child)."""
        if self.proc is None or not Path("/proc").is_dir():
            return None
        ticks = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # a process that just ended
            if int(fields[2]) == self.proc.pid:  # its process group
                ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"the worker is not running:\n{self.output()[-3000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the worker's process group (pool processes too), SIGKILL whatever is left."""
        if self.proc is None:
            return
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                continue
        self.proc = None


@contextmanager
def running_worker(concurrency: int) -> Iterator[Worker]:
    worker = Worker(concurrency)
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()


def wait_until(done: Callable[[], bool], *, worker: Worker, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not done within {timeout:.0f} s")
        worker.check_alive()
        time.sleep(POLL_INTERVAL)


class WarningCounter(logging.Handler):
    """Counts the warnings and errors this process logs, keeping the first few."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 3:
            self.first.append(f"{record.levelname} {record.name}: {record.getMessage()[:300]}")


def logging_quieten() -> WarningCounter:
    """Count this process's warnings instead of printing each (a flood would bury the table)."""
    counter = WarningCounter()
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setLevel(logging.ERROR)
    root.addHandler(counter)
    return counter


# --- The two phases -------------------------------------------------------------------------------


def redis_client() -> Any:
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


def bare_run(count: int, *, worker: Worker, timeout: float) -> Measurement:
    """Send `count` bare no-op tasks and time them until the worker has run them all."""
    from django.conf import settings

    from bench.baseline_tasks import noop

    client = redis_client()
    done_key = f"{settings.REDIS_KEY_PREFIX}bench:done:{uuid.uuid4().hex}"
    try:
        start = time.perf_counter()
        for _ in range(count):
            noop.apply_async(args=[done_key])
        sent = time.perf_counter()
        wait_until(lambda: int(client.get(done_key) or 0) >= count, worker=worker, timeout=timeout, what="bare celery")
        end = time.perf_counter()
    finally:
        client.delete(done_key)
        client.close()
    return Measurement(phase="bare", count=count, seconds=end - start, enqueue_seconds=sent - start)


def platform_run(count: int, *, worker: Worker, timeout: float, created: list[Any]) -> Measurement:
    """Submit `count` `demo.noop` jobs as `manage.py submit` does; time them until all are completed.

    The ids of the jobs made are appended to `created` (to delete them afterwards).
    """
    from jobs.services import jobs_submit_many

    start = time.perf_counter()
    ids: list[Any] = []
    for offset in range(0, count, SUBMIT_BATCH):
        # As the command: one transaction per batch; its jobs are dispatched when it commits.
        ids += [job.pk for job in jobs_submit_many(kind="demo.noop", inputs=[{}] * min(SUBMIT_BATCH, count - offset))]
    submitted = time.perf_counter()
    created += ids
    wait_until(jobs_finished(ids), worker=worker, timeout=timeout, what="platform")
    end = time.perf_counter()
    return Measurement(phase="platform", count=count, seconds=end - start, enqueue_seconds=submitted - start)


def jobs_finished(ids: list[Any]) -> Callable[[], bool]:
    """A check that is true once every job of `ids` is completed (and raises if one failed).

    Jobs run roughly in order, so each check only reads the first chunk still unfinished.
    """
    from jobs.models import Job

    remaining = list(ids)

    def check() -> bool:
        nonlocal remaining
        while remaining:
            chunk = remaining[:SUBMIT_BATCH]
            finished = dict(Job.objects.filter(pk__in=chunk, status__in=Job.TERMINAL).values_list("pk", "status"))
            failed = {pk: status for pk, status in finished.items() if status != Job.Status.COMPLETED}
            if failed:
                pk, status = next(iter(failed.items()))
                raise BenchError(f"{len(failed)} jobs did not complete; job {pk} is {status}")
            remaining = [pk for pk in chunk if pk not in finished] + remaining[SUBMIT_BATCH:]
            if len(finished) < len(chunk):
                return False
        return True

    return check


def measured(run: Callable[[], Measurement], *, worker: Worker, counter: WarningCounter) -> Measurement:
    """Run one phase and add the CPU time it cost, per task or job, and the warnings it raised."""

    def snapshot() -> tuple[float, float | None, int]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime, worker.cpu_seconds(), counter.count + len(worker.warnings())

    bench_before, worker_before, warnings_before = snapshot()
    measurement = run()
    bench_after, worker_after, warnings_after = snapshot()
    worker_cpu = None if worker_before is None or worker_after is None else worker_after - worker_before
    return replace(
        measurement,
        bench_cpu_ms=(bench_after - bench_before) * 1000 / measurement.count,
        worker_cpu_ms=None if worker_cpu is None else worker_cpu * 1000 / measurement.count,
        warnings=warnings_after - warnings_before,
    )


def jobs_delete(ids: list[Any]) -> None:
    from jobs.models import Job

    for offset in range(0, len(ids), SUBMIT_BATCH):
        Job.objects.filter(pk__in=ids[offset : offset + SUBMIT_BATCH]).delete()


def redis_keys_delete(prefix: str) -> None:
    """Drop every key of this run (its queue, Celery's bookkeeping): the prefix is the run's own."""
    client = redis_client()
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for offset in range(0, len(keys), 1000):
            client.delete(*keys[offset : offset + 1000])
    finally:
        client.close()


# --- What was measured, and on what ---------------------------------------------------------------


def code_revision() -> dict[str, Any]:
    """The commit measured, and whether files outside bench/ differed from it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=BASE_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)bench"],
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(changes.strip())}


def setup_describe(*, redis_kind: str, concurrency: int) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection

    client = redis_client()
    try:
        redis_version = client.info("server").get("redis_version", "?")
    finally:
        client.close()
    connection.ensure_connection()
    if connection.vendor == "postgresql":
        major, minor = divmod(connection.pg_version, 10000)
        database = {"engine": "postgresql", "version": f"{major}.{minor}"}
    else:
        import sqlite3

        database = {"engine": connection.vendor, "version": sqlite3.sqlite_version}
    return {
        "code": code_revision(),
        "machine": {
            # As `nproc`: the CPUs this process may run on.
            "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": platform.python_version(),
            "system": f"{platform.system()} {platform.machine()}",
            "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
        },
        "database": database,
        "redis": {"kind": redis_kind, "version": redis_version},
        "worker": {
            "pool": "prefork",
            "concurrency": concurrency,
            "prefetch_multiplier": settings.CELERY_WORKER_PREFETCH_MULTIPLIER,
            "acks_late": settings.CELERY_TASK_ACKS_LATE,
            "max_tasks_per_child": settings.CELERY_WORKER_MAX_TASKS_PER_CHILD,
            "serializer": settings.CELERY_TASK_SERIALIZER,
            "task_events": settings.CELERY_WORKER_SEND_TASK_EVENTS,
            "debug": settings.DEBUG,
        },
    }


def summarize(runs: list[Measurement]) -> dict[str, Any]:
    def median(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return round(statistics.median(known), 3) if known else None

    def phase(name: str) -> dict[str, Any]:
        mine = [run for run in runs if run.phase == name]
        best = max(mine, key=lambda run: run.per_second)
        count = best.count
        return {
            "count": count,
            "runs": len(mine),
            "best_seconds": round(best.seconds, 3),
            "best_per_second": round(best.per_second, 1),
            "median_seconds": round(statistics.median(run.seconds for run in mine), 3),
            "median_per_second": round(statistics.median(run.per_second for run in mine), 1),
            "enqueue_ms_per_item_best": round(min(run.enqueue_seconds for run in mine) / count * 1000, 3),
            "enqueue_ms_per_item_median": median([run.enqueue_seconds / count * 1000 for run in mine]),
            "bench_cpu_ms_per_item_median": median([run.bench_cpu_ms for run in mine]),
            "worker_cpu_ms_per_item_median": median([run.worker_cpu_ms for run in mine]),
            "warnings": sum(run.warnings for run in mine),
        }

    def cpu_per_item(phase: dict[str, Any]) -> float | None:
        bench, worker = phase["bench_cpu_ms_per_item_median"], phase["worker_cpu_ms_per_item_median"]
        return None if bench is None or worker is None else bench + worker

    bare, plat = phase("bare"), phase("platform")
    ratio_median = plat["median_per_second"] / bare["median_per_second"]
    bare_cpu, plat_cpu = cpu_per_item(bare), cpu_per_item(plat)
    return {
        "bare": bare,
        "platform": plat,
        "ratio_best": round(plat["best_per_second"] / bare["best_per_second"], 3),
        "ratio_median": round(ratio_median, 3),
        # CPU a bare task costs over CPU a job costs (bench and worker processes): what the ratio
        # would be on a machine where CPU is the limit and nothing else runs. Steadier than
        # wall time on a busy machine.
        "cpu_ratio": round(bare_cpu / plat_cpu, 3) if bare_cpu and plat_cpu else None,
        "aim": AIM,
        "aim_met": ratio_median >= AIM,
    }


def table_rows(summary: dict[str, Any], which: str) -> list[tuple[str, int, float, float, float]]:
    """(name, count, seconds, per second, ratio) of both phases, `which` being "best" or "median"."""
    rows = []
    for label, key in (("bare celery", "bare"), ("platform", "platform")):
        phase = summary[key]
        ratio = phase[f"{which}_per_second"] / summary["bare"][f"{which}_per_second"]
        rows.append((label, phase["count"], phase[f"{which}_seconds"], phase[f"{which}_per_second"], ratio))
    return rows


def cpu_text(phase: dict[str, Any]) -> str:
    bench, worker = phase["bench_cpu_ms_per_item_median"], phase["worker_cpu_ms_per_item_median"]
    if bench is None or worker is None:
        return "n/a"
    return f"{bench:.2f} ms sending, {worker:.2f} ms in the worker"


def table_print(result: dict[str, Any], warnings_first: list[str]) -> None:
    summary = result["summary"]
    setup = f"{result['database']['engine']} {result['database']['version']}, {result['redis']['kind']} Redis"
    setup += f" {result['redis']['version']}, {result['worker']['concurrency']} worker processes"
    load = ", ".join(str(value) for value in result["machine"]["load_average_at_start"])
    print(f"\n{setup}; nproc {result['machine']['nproc']}, load average at start {load}")
    for which in ("best", "median") if result["repeat"] > 1 else ("best",):
        title = f"{which} of {result['repeat']}" if result["repeat"] > 1 else ""
        print(f"\n{title:<14}{'count':>8}{'seconds':>10}{'per second':>12}{'ratio':>8}")
        for label, count, seconds, per_second, ratio in table_rows(summary, which):
            print(f"{label:<14}{count:>8}{seconds:>10.3f}{per_second:>12.1f}{ratio:>8.2f}")
    plat, bare = summary["platform"], summary["bare"]
    print(
        f"\nplatform submit: {plat['enqueue_ms_per_item_median']:.3f} ms per job"
        f" (bare apply_async: {bare['enqueue_ms_per_item_median']:.3f} ms per task)"
    )
    print(f"CPU per task, bare celery: {cpu_text(bare)}")
    print(f"CPU per job, platform:     {cpu_text(plat)}")
    warnings = bare["warnings"] + plat["warnings"]
    if warnings:
        print(f"{warnings} warnings or errors were logged while timing (see var/bench-worker.log); first:")
        for line in warnings_first:
            print(f"  {line}")
    if summary["cpu_ratio"] is not None:
        print(f"CPU-time ratio (bare CPU per task / platform CPU per job): {summary['cpu_ratio']:.2f}")
    verdict = "met" if summary["aim_met"] else "NOT met"
    ratio = plat["median_per_second"] / bare["median_per_second"]  # unrounded, as in the table
    print(f"aim platform/bare >= {AIM}: {verdict} (median ratio {ratio:.2f})\n")


def run_header() -> dict[str, str]:
    """The fields that open a bench's result: when it ran (UTC, ISO 8601), the commit measured,
    and the machine."""
    return {"when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "revision": code_revision()["commit"],
            "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}"}


def results_save(name: str, when: str, result: dict[str, Any], latest: str | None = None) -> Path:
    """Write a bench's `result` to `bench/results/<name>-<UTC timestamp of when>.json` and, when
    given, its `latest` table to `<name>-latest.md`; return the JSON's path. `when` is ISO 8601."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(when).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if latest is not None:
        (RESULTS_DIR / f"{name}-latest.md").write_text(latest)
    return path


def results_write(result: dict[str, Any]) -> Path:
    path = results_save("throughput", result["date"], result)
    latest_write()
    return path


def latest_write() -> None:
    """Rewrite throughput-latest.md from the newest result of each database and Redis setup."""
    newest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in sorted(RESULTS_DIR.glob("throughput-*.json")):
        try:
            result = json.loads(path.read_text())
            key = (result["database"]["engine"], result["redis"]["kind"], result["worker"]["concurrency"])
        except (ValueError, KeyError, TypeError):
            continue
        if key not in newest or result["date"] > newest[key]["date"]:
            newest[key] = result
    lines = [
        "# Throughput: bare Celery against the platform",
        "",
        "Written by `bench/throughput.py` (see `bench/README.md`): the newest result of each setup.",
        f"Bare Celery runs no-op tasks; the platform runs `demo.noop` jobs end to end. Aim: ratio ≥ {AIM}.",
    ]
    for result in sorted(newest.values(), key=lambda result: result["date"], reverse=True):
        summary, which = result["summary"], "median" if result["repeat"] > 1 else "best"
        machine, code = result["machine"], result.get("code", {})
        revision = f"{code.get('commit')}{' with local changes' if code.get('dirty') else ''}"
        lines += [
            "",
            f"## {result['database']['engine']}, {result['redis']['kind']} Redis,"
            f" {result['worker']['concurrency']} worker processes",
            "",
            f"- date: {result['date']}; code: {revision}",
            f"- machine: nproc {machine['nproc']}, {machine['system']}, Python {machine['python']},"
            f" load average at start {', '.join(str(value) for value in machine['load_average_at_start'])}",
            f"- database: {result['database']['engine']} {result['database']['version']};"
            f" Redis: {result['redis']['kind']} {result['redis']['version']}",
            f"- worker: prefork, concurrency {result['worker']['concurrency']}, prefetch"
            f" {result['worker']['prefetch_multiplier']}, acks_late {result['worker']['acks_late']}",
            f"- {which} of {result['repeat']} run(s)",
            "",
            "| | count | seconds | per second | ratio |",
            "|---|---:|---:|---:|---:|",
        ]
        for label, count, seconds, per_second, ratio in table_rows(summary, which):
            lines.append(f"| {label} | {count} | {seconds:.3f} | {per_second:.1f} | {ratio:.2f} |")
        lines += [
            "",
            f"Platform submit: {summary['platform']['enqueue_ms_per_item_median']:.3f} ms per job"
            f" (bare `apply_async`: {summary['bare']['enqueue_ms_per_item_median']:.3f} ms per task).",
            f"CPU per bare task: {cpu_text(summary['bare'])}; per platform job: {cpu_text(summary['platform'])}.",
        ]
        if summary.get("cpu_ratio") is not None:
            lines.append(f"CPU-time ratio (bare CPU per task / platform CPU per job): {summary['cpu_ratio']:.2f}.")
    (RESULTS_DIR / "throughput-latest.md").write_text("\n".join(lines) + "\n")


# --- Main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="tasks and jobs per phase (default 2000)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=int(os.environ.get("WORKER_CONCURRENCY") or 2),
        help="worker pool processes (default WORKER_CONCURRENCY or 2)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of both phases; best and median (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a phase may take (default 600)")
    parser.add_argument("--keep-jobs", action="store_true", help="keep the jobs it made (default: delete them)")
    parser.add_argument("--no-write", action="store_true", help="print only; write nothing to bench/results")
    args = parser.parse_args(argv)
    for name in ("count", "concurrency", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    environment = prepare_environment()

    import django

    django.setup()
    from django.core.management import call_command

    counter = logging_quieten()
    call_command("migrate", interactive=False, verbosity=0)
    result: dict[str, Any] = {
        "bench": "throughput",
        "date": datetime.now(UTC).replace(microsecond=0).isoformat(),
        **setup_describe(redis_kind=environment["redis_kind"], concurrency=args.concurrency),
        "count": args.count,
        "repeat": args.repeat,
    }
    runs: list[Measurement] = []
    created: list[Any] = []
    warnings_first: list[str] = []
    try:
        with running_worker(args.concurrency) as worker:
            print(f"worker ready ({args.concurrency} processes); warming up", flush=True)
            bare_run(WARMUP, worker=worker, timeout=args.timeout)
            platform_run(WARMUP, worker=worker, timeout=args.timeout, created=created)
            counter.first.clear()  # those of start-up and warm-up are not reported
            worker_seen = len(worker.warnings())
            phases: list[Callable[[], Measurement]] = [
                lambda: bare_run(args.count, worker=worker, timeout=args.timeout),
                lambda: platform_run(args.count, worker=worker, timeout=args.timeout, created=created),
            ]
            for index in range(args.repeat):
                for phase in phases:
                    run = measured(phase, worker=worker, counter=counter)
                    runs.append(run)
                    print(
                        f"run {index + 1}/{args.repeat} {run.phase:<8} {run.count} in {run.seconds:.3f} s"
                        f" = {run.per_second:.1f}/s (enqueued in {run.enqueue_seconds:.3f} s)",
                        flush=True,
                    )
            warnings_first = (counter.first + worker.warnings()[worker_seen:])[:3]
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_jobs:
            jobs_delete(created)
        redis_keys_delete(environment["redis_key_prefix"])
    result["runs"] = [run.as_dict() for run in runs]
    result["summary"] = summarize(runs)
    table_print(result, warnings_first)
    if not args.no_write:
        path = results_write(result)
        print(f"wrote {path.relative_to(BASE_DIR)} and {(RESULTS_DIR / 'throughput-latest.md').relative_to(BASE_DIR)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
