"""A no-op job's own cost in one process: the platform's run against the floor's two statements.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python bench/job_path.py [--count 2000] [--rounds 5]

No Celery and no other process: what `bench/shipped.py` cannot separate from the machine's drift.
Each round times, on the same connection to PostgreSQL and Redis, back to back:

1. the platform: `job_execute` (the pool process's whole run: claim, handler, outcome, the two
   events written and pushed) over `--count` pending `demo.noop` jobs;
2. the floor: the same two statements (the claim and the outcome, each an UPDATE with its event's
   INSERT), taken verbatim from the platform at the start (`bench.bare_durable`), sent on a psycopg
   connection of their own over as many jobs on copies of the platform's tables.

It prints each round's CPU per job (this process's, `time.process_time`) and the median round,
the Python calls per job of each (cProfile, one counted pass of 200 jobs: a figure the machine's
speed does not move) and, with PostgreSQL on this machine, the CPU each side's backend spent per
job (from its /proc entry). Then a job's two moves taken apart (`MOVE_SIDES`, each round's figures
over that round's floor, the sides' order reversed every other round): the claim and the completion
through every layer of a move (`job_claim`, `job_complete`), the same two statements with the same
parameters sent straight to `prepared_fetch` with and without a `Job` built from each row, and the
floor's two statements through the same `prepared_fetch`, all on the platform's tables and
connection. Then what Celery's tracer does around a task's body (`build_tracer`, as a pool
process runs each message; the body a no-op): a bare `celery.Task`, `jobs.run` as shipped (its
class checks the connections: no signal is sent), and `jobs.run` with the `task_prerun` and
`task_postrun` receivers of Celery's Django fix-up connected, alternating: CPU per task. The
jobs are written before each timed loop, untimed. The database's tables are the platform's own
(migrated here); the bench's copies are dropped at the end. Writes
`bench/results/job-path-<UTC timestamp>.json` and `job-path-latest.md`.

Hot loops run faster than a pool process does (each job there follows an idle wait: see
bench/README.md, "Whose CPU a job costs"), so compare the two rows with each other, not with the
shipped bench's CPU per job.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import results_save, run_header  # noqa: E402

COUNTED = 200  # jobs of the pass whose Python calls are counted
WARMUP = 50  # jobs run first, untimed, by each side (connections, prepared statements, caches)


def platform_side() -> tuple[Callable[[int], list], Callable[[list], None]]:
    """(make n pending no-op jobs, run them with `job_execute`)."""
    from jobs.runner import job_execute
    from jobs.services import jobs_submit_many

    def make(n: int) -> list:
        with mock.patch("jobs.services.transitions.jobs_dispatch"):  # run here, by no worker
            return [job.pk for job in jobs_submit_many(kind="demo.noop", inputs=[{}] * n)]

    def run(ids: list) -> None:
        for job_id in ids:
            outcome = job_execute(job_id=job_id, worker="bench pid 0", worker_hostname="bench", task_id="bench")
            if outcome != "completed":
                raise SystemExit(f"bench: job {job_id} ended {outcome!r}, not completed")

    return make, run


def floor_side(dsn: str) -> tuple[Callable[[int], list], Callable[[list], None], Any]:
    """(make n pending jobs in the bench's tables, run the two statements for each, the
    connection to close at the end)."""
    import psycopg

    from bench import bare_durable

    statements = bare_durable.capture_statements()
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    bare_durable.create_tables(conn)
    cursor = conn.cursor()

    def make(n: int) -> list:
        ids = [uuid.uuid4() for _ in range(n)]
        bare_durable.insert_pending(conn, ids)
        return [str(job_id) for job_id in ids]

    def run(ids: list) -> None:
        for job_id in ids:
            # As `bare_durable.run` does, in its worker.
            params = {"id": job_id, "worker": "bench pid 0", "task": "bench", "now": datetime.now(UTC)}
            if cursor.execute(statements["claim"], params).fetchone() is None:
                raise SystemExit(f"bench: the floor's job {job_id} was not claimed")
            params["now"] = datetime.now(UTC)
            cursor.execute(statements["outcome"], params).fetchone()

    return make, run, conn


MOVE_SIDES = ("every layer", "straight, a Job read", "straight", "the floor's statements")


def moves_apart(count: int, rounds: int) -> dict[str, Any]:
    """CPU ms per job of a job's two moves (the claim, the completion), sent four ways
    (`MOVE_SIDES`) on the platform's tables and connection, and each way's ratio to the last in the
    same round (the machine's speed moves between rounds; the order is reversed every other one)."""
    from django.db import connection

    from bench import bare_durable
    from dbkit import prepared
    from jobs.models import Job, JobEvent, job_from_row
    from jobs.services import job_claim, job_complete

    make, _ = platform_side()
    sent: list[tuple[str, list]] = []

    def spy(conn: Any, sql: str, params: Any, **kwargs: Any) -> Any:
        sent.append((sql, list(params)))
        return prepared.prepared_fetch(conn, sql, params, **kwargs)

    with mock.patch("jobs.models.prepared_fetch", spy):  # the platform's two statements, as sent
        claimed = job_claim(job_id=make(1)[0], worker="bench pid 0", task_id="bench")
        job_complete(job=claimed, result={})
    if len(sent) != 2:
        raise SystemExit(f"bench: a job's two moves sent {len(sent)} statements through prepared_fetch, not 2")
    # Where the job's id goes in each statement's parameters (the event's time is the last).
    moves = [(sql, params, next(i for i, value in enumerate(params) if isinstance(value, uuid.UUID)))
             for sql, params in sent]
    floor = bare_durable.capture_statements(jobs_table=Job._meta.db_table, events_table=JobEvent._meta.db_table)

    def layers(ids: list) -> None:
        for job_id in ids:
            job_complete(job=job_claim(job_id=job_id, worker="bench pid 0", task_id="bench"), result={})

    def straight(ids: list, read: bool) -> None:
        for job_id in ids:
            for sql, template, at in moves:
                params = list(template)
                params[at], params[-1] = uuid.UUID(str(job_id)), datetime.now(UTC)
                row = prepared.prepared_fetch(connection, sql, params, one=True)
                if row is None:
                    raise SystemExit(f"bench: job {job_id}: a straight move matched no row")
                if read:
                    job_from_row(row, using=connection.alias, connection=connection)

    def floors(ids: list) -> None:
        for job_id in ids:
            params = {"id": str(job_id), "worker": "bench pid 0", "task": "bench", "now": datetime.now(UTC)}
            for name in ("claim", "outcome"):
                if prepared.prepared_fetch(connection, floor[name], params, one=True) is None:
                    raise SystemExit(f"bench: job {job_id}: the floor's {name} matched no row")
                params["now"] = datetime.now(UTC)

    sides = dict(zip(MOVE_SIDES, (layers, lambda ids: straight(ids, True), lambda ids: straight(ids, False),
                                  floors), strict=True))
    for run in sides.values():
        run(make(WARMUP))
    per_round = []
    for number in range(1, rounds + 1):
        row: dict[str, Any] = {"round": number}
        for name in (MOVE_SIDES if number % 2 else MOVE_SIDES[::-1]):
            ids = make(count)
            cpu = time.process_time()
            sides[name](ids)
            row[name] = round((time.process_time() - cpu) / len(ids) * 1000, 4)
        per_round.append(row)
        print(f"round {number}: a job's two moves, CPU ms per job: "
              + ", ".join(f"{name} {row[name]:.3f}" for name in MOVE_SIDES), flush=True)
    base = MOVE_SIDES[-1]
    return {"rounds": per_round,
            "median_cpu_ms_per_job": {name: round(statistics.median(row[name] for row in per_round), 4)
                                      for name in MOVE_SIDES},
            "median_over_floor": {name: round(statistics.median(row[name] / row[base] for row in per_round), 3)
                                  for name in MOVE_SIDES}}


AROUND_SIDES = ("a bare task", "jobs.run as shipped", "with the fix-up's receivers")


def around_tasks(count: int, rounds: int) -> dict[str, Any]:
    """CPU µs per task of what Celery's tracer does around a task's body (`build_tracer`, as a
    pool process runs each message), the body a no-op: a bare `celery.Task` with no signal
    receivers (the floor), `jobs.run` as shipped (its class checks the connections and tells the
    run observers: `dbkit.tasks`, `jobs.tasks.JobRunTask`; no receiver, so no signal is sent),
    and the same with the `task_prerun` and `task_postrun` receivers of Celery's Django fix-up
    connected (as a worker with CELERY_DB_REUSE_MAX 0 has them). Each side a round, alternating."""
    from celery import Task, signals
    from celery.app.trace import build_tracer
    from celery.fixups.django import DjangoFixup
    from django.db import connection

    from jobs.tasks import job_run
    from taskplatform import celery as worker_setup

    app = worker_setup.app
    fixup = next(f for f in app._fixups or () if isinstance(f, DjangoFixup)).worker_fixup
    fixup.install()  # as a worker's `worker_init` does; then taken over, as it does too
    worker_setup._take_over_the_fixups_task_hooks()
    shipped = job_run._get_current_object()
    shipped.run = lambda job_id: "completed"  # the body: the job's own path is measured above
    def around_bare(job_id: str) -> str:
        return "completed"

    bare = app.task(name="bench.around_bare", base=Task, shared=False, ignore_result=True)(around_bare)
    tracers = {task: build_tracer(task.name, task, app=app, hostname="bench", eager=False, propagate=True)
               for task in (shipped, bare)}
    args = [str(uuid.uuid4())]
    connection.ensure_connection()

    def around(name: str, n: int) -> float:
        task = bare if name == AROUND_SIDES[0] else shipped
        tracer = tracers[task]
        request = {"id": "bench", "hostname": "bench", "shadow": "demo.noop", "delivery_info": {}}
        if name == AROUND_SIDES[2]:
            signals.task_prerun.connect(fixup.on_task_prerun)
            signals.task_postrun.connect(fixup.on_task_postrun)
        try:
            cpu = time.process_time()
            for _ in range(n):
                tracer("bench", args, {}, request)
            return (time.process_time() - cpu) / n * 1e6
        finally:
            signals.task_prerun.disconnect(fixup.on_task_prerun)
            signals.task_postrun.disconnect(fixup.on_task_postrun)

    per_round = []
    try:
        for name in AROUND_SIDES:
            around(name, WARMUP)
        for number in range(1, rounds + 1):
            row: dict[str, Any] = {"round": number}
            for name in AROUND_SIDES if number % 2 else reversed(AROUND_SIDES):
                row[name] = round(around(name, count), 2)
            per_round.append(row)
            print(f"round {number}: around each task, µs of CPU per task: "
                  + ", ".join(f"{name} {row[name]:.1f}" for name in AROUND_SIDES), flush=True)
    finally:
        del shipped.run
        app.tasks.pop(bare.name, None)
    return {"rounds": per_round,
            "median_us_per_task": {name: round(statistics.median(row[name] for row in per_round), 2)
                                   for name in AROUND_SIDES}}


def backend_cpu_seconds(pid: int | None) -> float | None:
    """The CPU seconds the PostgreSQL backend `pid` has used (its /proc entry: the server on this
    machine), or None where it cannot be read."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def timed(make: Callable[[int], list], run: Callable[[list], None], count: int,
          backend: Callable[[], int | None] = lambda: None) -> dict[str, float]:
    ids = make(count)
    pid = backend()
    server = backend_cpu_seconds(pid)
    cpu, wall = time.process_time(), time.perf_counter()
    run(ids)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    row = {"cpu_ms_per_job": round(cpu / len(ids) * 1000, 4), "wall_ms_per_job": round(wall / len(ids) * 1000, 4)}
    after = backend_cpu_seconds(pid)
    if server is not None and after is not None and backend() == pid:
        row["postgres_cpu_ms_per_job"] = round((after - server) / len(ids) * 1000, 4)
    return row


def calls_per_job(make: Callable[[int], list], run: Callable[[list], None], count: int) -> float:
    ids = make(count)
    profile = cProfile.Profile()
    profile.runcall(run, ids)
    return round(pstats.Stats(profile).total_calls / len(ids), 1)


def measure(count: int, rounds: int, dsn: str) -> dict[str, Any]:
    """`rounds` rounds of `count` jobs a side; the bench's tables are dropped at the end."""
    from django.db import connection

    sides = {"platform": platform_side()}
    make, run, conn = floor_side(dsn)
    sides["floor"] = (make, run)
    # Each side's PostgreSQL backend: the CPU the server spends on its statements.
    backends = {"platform": lambda: connection.connection.info.backend_pid if connection.connection else None,
                "floor": lambda: conn.info.backend_pid}
    try:
        for make, run in sides.values():
            run(make(WARMUP))
        per_round = []
        for number in range(1, rounds + 1):
            row: dict[str, Any] = {name: timed(make, run, count, backends[name]) for name, (make, run) in sides.items()}
            row["round"] = number
            row["ratio"] = round(row["platform"]["cpu_ms_per_job"] / row["floor"]["cpu_ms_per_job"], 2)
            per_round.append(row)
            print(f"round {number}: platform {row['platform']['cpu_ms_per_job']:.3f} ms, floor "
                  f"{row['floor']['cpu_ms_per_job']:.3f} ms of CPU per job ({row['ratio']}×)", flush=True)
        calls = {name: calls_per_job(make, run, min(count, COUNTED)) for name, (make, run) in sides.items()}
    finally:
        from bench import bare_durable

        conn.execute(f"DROP TABLE IF EXISTS {bare_durable.EVENTS}, {bare_durable.JOBS}")
        conn.close()
    median = {name: round(statistics.median(row[name]["cpu_ms_per_job"] for row in per_round), 4) for name in sides}
    server = {name: round(statistics.median(row[name]["postgres_cpu_ms_per_job"] for row in per_round), 4)
              for name in sides if all("postgres_cpu_ms_per_job" in row[name] for row in per_round)}
    return {"rounds": per_round, "median_cpu_ms_per_job": median, "median_postgres_cpu_ms_per_job": server,
            "median_ratio": round(statistics.median(row["ratio"] for row in per_round), 2),
            "python_calls_per_job": calls, "moves_apart": moves_apart(count, rounds),
            "around_tasks": around_tasks(count, rounds)}


def markdown(result: dict[str, Any]) -> str:
    median, calls = result["median_cpu_ms_per_job"], result["python_calls_per_job"]
    lines = [
        f"# A no-op job's own cost in one process ({result['when']}, code {result['revision']})",
        "",
        f"{result['machine']}; {result['count']} jobs a side a round, {len(result['rounds'])} rounds, alternating; "
        "`bench/job_path.py`.",
        "",
        "| round | platform, CPU ms/job | floor, CPU ms/job | platform × floor |",
        "|---:|---:|---:|---:|",
    ]
    for row in result["rounds"]:
        lines.append(f"| {row['round']} | {row['platform']['cpu_ms_per_job']:.3f} | "
                     f"{row['floor']['cpu_ms_per_job']:.3f} | {row['ratio']} |")
    lines += [
        f"| median | {median['platform']:.3f} | {median['floor']:.3f} | {result['median_ratio']} |",
        "",
        f"Python calls per job: the platform {calls['platform']:,.0f}, the floor {calls['floor']:,.0f}.",
        "",
    ]
    server = result.get("median_postgres_cpu_ms_per_job") or {}
    if len(server) == 2:
        lines += [f"PostgreSQL's CPU per job (each side's backend): the platform {server['platform']:.3f} ms, "
                  f"the floor {server['floor']:.3f} ms (medians).", ""]
    apart = result.get("moves_apart")
    if apart:
        over = apart["median_over_floor"]
        lines += ["A job's two moves taken apart, on the platform's tables and connection: CPU ms per job, and each "
                  "round's figure over that round's last column (medians):", "",
                  "| round | " + " | ".join(MOVE_SIDES) + " |", "|---:|" + "---:|" * len(MOVE_SIDES)]
        for row in apart["rounds"]:
            lines.append(f"| {row['round']} | " + " | ".join(f"{row[name]:.3f}" for name in MOVE_SIDES) + " |")
        medians = apart["median_cpu_ms_per_job"]
        lines += ["| median | " + " | ".join(f"{medians[name]:.3f}" for name in MOVE_SIDES) + " |",
                  "| × the floor's | " + " | ".join(f"{over[name]:.2f}" for name in MOVE_SIDES) + " |", ""]
    around = result.get("around_tasks")
    if around:
        lines += ["What Celery's tracer does around each task's body (a no-op), CPU µs per task:", "",
                  "| round | " + " | ".join(AROUND_SIDES) + " |", "|---:|" + "---:|" * len(AROUND_SIDES)]
        for row in around["rounds"]:
            lines.append(f"| {row['round']} | " + " | ".join(f"{row[name]:.1f}" for name in AROUND_SIDES) + " |")
        medians = around["median_us_per_task"]
        lines += ["| median | " + " | ".join(f"{medians[name]:.1f}" for name in AROUND_SIDES) + " |", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="jobs a side a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.count < 1 or args.rounds < 1:
        raise SystemExit("bench: --count and --rounds must be at least 1")
    dsn = os.environ.get("DATABASE_URL", "")
    if not dsn.startswith("postgres") or not os.environ.get("REDIS_URL"):
        raise SystemExit("bench: set DATABASE_URL (PostgreSQL; the bench migrates it and writes jobs into it) "
                         "and REDIS_URL (the events are pushed there)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    measured = measure(args.count, args.rounds, dsn)
    result = {**run_header(), "count": args.count, **measured}
    text = markdown(result)
    print(text)
    if not args.no_write:
        results_save("job-path", result["when"], result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
