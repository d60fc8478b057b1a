"""Chaos bench: the faults of the chaos suite (`tests/chaos/`) at a larger size, and the counts.

    python bench/chaos.py [--jobs 200] [--workers 2] [--concurrency 2] [--gap 15]

It starts a PostgreSQL cluster and a Redis server of its own (`tests/chaos/servers.py`, on free
ports; the machine's shared servers are never touched), migrates, and runs the platform on them as
deployed: job workers (`-Q jobs`), a platform worker (`-Q platform`) for beat's reconciler, Celery
beat and uvicorn, with a short lease and a fast reconciler. Every process runs the test settings,
so the test kinds (`test.crash`, `test.stubborn`) exist.

While `--jobs` `demo.sleep` jobs run (fed so that `--backlog` of them wait at any time), next to
`demo.review` jobs that a reviewer answers, poison jobs (`test.crash`) and a stubborn one
(`test.stubborn`), it causes, `--gap` seconds apart: cancellations in every state (pending,
processing, paused, and the stubborn run, terminated after the grace); kill -9 of a job worker
(and a replacement); SIGTERM of a job worker (hand-back; and a replacement); the `jobs.run`
message of some jobs sent again; Redis restarting empty; PostgreSQL restarting.

Then it waits for every job to finish and prints the counts: jobs by outcome against what was
expected, event logs with gaps, finished steps that ran again (`demo.sleep` counts its step bodies
outside the checkpoint), in-flight re-runs against the runs lost, attempts lost and recovery time
per fault. Exit status 1 when anything was lost or repeated. Writes
`bench/results/chaos-<UTC timestamp>.json` and rewrites `bench/results/chaos-latest.md`; the
processes' output goes to `var/chaos/`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform as platform_info
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script (`python bench/chaos.py`)
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import RESULTS_DIR, WarningCounter, code_revision  # noqa: E402

LOG_DIR = BASE_DIR / "var" / "chaos"
DATABASE = "chaos_bench"
FAULTS = ("cancel", "kill9", "sigterm", "duplicate", "redis", "postgres")
TERMINAL = frozenset({"completed", "failed", "cancelled"})
TICK = 0.25  # seconds between two looks at the jobs (feeding, answering, scheduling the next fault)
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
NOT_CLAIMED = re.compile(rf"job ({UUID}) not claimed")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
LOG_PROBLEM = re.compile(r" (ERROR|CRITICAL) |: (ERROR|CRITICAL)/|Traceback")
RECONCILER_LINES = {
    "redispatched": re.compile(r"re-dispatched (\d+) pending job"),
    "taken_back": re.compile(r"took back (\d+) job"),
    "terminated": re.compile(r"terminated (\d+) cancelled run"),
}


class BenchError(RuntimeError):
    pass


class DatabaseAway(Exception):
    """The private PostgreSQL did not answer (it is restarting): try again at the next tick."""


@dataclass
class Fault:
    name: str  # one of FAULTS
    label: str
    at: float  # time.time() when it was caused
    in_flight: list[str] = field(default_factory=list)  # jobs running where it struck, then
    queued: list[str] = field(default_factory=list)  # jobs pending then, their messages lost (restarts)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    status: str
    kind: str
    worker: str
    steps_done: int
    leased: bool


def port_free() -> int:
    # Not `tests.chaos.servers.free_port`: importing that module reads Django's settings, which
    # need the servers' URLs (so their ports) first.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment_prepare(args: argparse.Namespace) -> dict[str, str]:
    """Settings of the bench and of every process it starts; set before Django reads them."""
    env = {
        "DJANGO_SETTINGS_MODULE": "taskplatform.settings.test",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port_free()}/{DATABASE}",
        "REDIS_URL": f"redis://127.0.0.1:{port_free()}/0",
        "REDIS_KEY_PREFIX": f"chaos-bench-{uuid.uuid4().hex[:8]}:",
        "DJANGO_DEBUG": "false",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "readable",
        "JOBS_LEASE_SECONDS": f"{args.lease:g}",
        "JOBS_RECONCILE_INTERVAL": f"{args.reconcile:g}",
        "JOBS_DISPATCH_GRACE": f"{args.grace:g}",
        "JOBS_CANCEL_GRACE": f"{args.cancel_grace:g}",
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update(env)
    return env


def logging_to_file(path: Path) -> WarningCounter:
    """This process's own log lines go to `path` (a restart makes the platform's code log
    tracebacks of failed dispatches here), counted, not printed over the table."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)
    counter = WarningCounter()
    root.addHandler(counter)
    return counter


def database_call(fn: Any) -> Any:
    """Run `fn()`; a lost database connection becomes DatabaseAway (and is closed)."""
    from django.db import InterfaceError, OperationalError, connection

    try:
        return fn()
    except (OperationalError, InterfaceError) as exc:
        connection.close()
        raise DatabaseAway(str(exc)) from exc


def log_time(line: str) -> float | None:
    """A readable log line's time (the processes run on this machine, in its zone)."""
    match = LOG_TIME.match(line)
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


class ChaosBench:
    """The servers, the platform's processes, the jobs, the faults, and what is read back."""

    def __init__(self, args: argparse.Namespace, workdir: Path, pg_root: Path) -> None:
        from tests.chaos.servers import PrivatePostgres, PrivateRedis

        self.args = args
        self.workdir = workdir
        self.prefix = os.environ["REDIS_KEY_PREFIX"]
        self.redis = PrivateRedis(workdir / "redis", port=urlsplit(os.environ["REDIS_URL"]).port)
        self.pg = PrivatePostgres(pg_root, port=urlsplit(os.environ["DATABASE_URL"]).port)
        self.platform: Any = None
        self.job_workers: list[Any] = []  # running
        self.retired: list[Any] = []  # killed or stopped on purpose
        self.worker_count = 0
        self.hostnames: dict[Any, str] = {}
        # The jobs: their role, the order they were submitted in, and what was done to them.
        self.roles: dict[str, str] = {}
        self.order: list[str] = []
        self.sleep_submitted = 0
        self.api_failures = 0
        self.submit_failures = 0
        self.reserved_reviews: list[str] = []  # to cancel while paused
        self.answer_at: dict[str, float] = {}
        self.answered: set[str] = set()
        self.answer_errors: list[str] = []
        self.cancelled: dict[str, dict[str, Any]] = {}
        self.run_stopped_at: dict[str, float] = {}  # cancelled processing jobs: when their lease went
        self.faults: list[Fault] = []
        self.started = time.time()
        self.reviewer: Any = None

    # -- servers and processes --------------------------------------------------------------------
    def start(self) -> None:
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.core.management import call_command

        from tests.chaos.servers import Platform
        from tests.support.processes import celery_worker

        self.redis.start()
        self.pg.start()
        self.pg.create_database(DATABASE)
        call_command("migrate", interactive=False, verbosity=0)
        self.reviewer = get_user_model().objects.create_user(username="chaos-reviewer", is_staff=True)
        self.reviewer.groups.add(Group.objects.get(name="reviewers"))
        platform = Platform(
            database_url=os.environ["DATABASE_URL"], redis_url=os.environ["REDIS_URL"], workdir=self.workdir,
            prefix=self.prefix, concurrency=1,
        )
        # Beat's housekeeping on a worker of its own, as deployed: killing a job worker must not
        # take the reconciler with it.
        platform.worker = celery_worker(concurrency=1, queues="platform", name="chaos-platform", env=platform.env)
        self.platform = platform.start()
        self.platform.api_token()
        for _ in range(self.args.workers):
            self.worker_start()

    def worker_start(self) -> Any:
        from tests.support.processes import celery_worker

        self.worker_count += 1
        name = f"jobs-{self.worker_count}"
        worker = celery_worker(concurrency=self.args.concurrency, queues="jobs", name=name, env=self.platform.env)
        worker.start()
        # As `tests.support.processes.celery_worker` names it (`--hostname {name}-{pid}@%h`).
        self.hostnames[worker] = f"{name}-{os.getpid()}@{socket.gethostname()}"
        self.job_workers.append(worker)
        return worker

    def processes(self) -> list[Any]:
        every = [*(self.platform.processes if self.platform else []), *self.job_workers, *self.retired]
        return list(dict.fromkeys(every))

    def processes_died(self) -> list[str]:
        """The platform's processes that exited though nobody stopped them."""
        alive = [*(self.platform.processes if self.platform else []), *self.job_workers]
        return [f"{p.name} (exit {p.proc.returncode})" for p in alive if p.proc and p.proc.poll() is not None]

    def stop(self) -> None:
        for process in self.processes():
            try:
                process.stop(timeout=10)
            except Exception as exc:  # keep stopping the others
                print(f"could not stop {process.name}: {exc}", file=sys.stderr)
        self.logs_write()
        self.redis.stop()
        self.pg.destroy()

    def logs_write(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        for process in self.processes():
            (LOG_DIR / f"{process.name}.log").write_text(process.output + "\n")

    # -- the jobs ---------------------------------------------------------------------------------
    def rows(self) -> dict[str, Row]:
        from django.db.models import Count

        from jobs.models import Job

        values = database_call(
            lambda: list(Job.objects.annotate(steps_done=Count("steps")).values_list(
                "pk", "status", "kind", "worker", "steps_done", "lease_expires_at"))
        )
        return {
            str(pk): Row(status, kind, worker, steps_done, lease is not None)
            for pk, status, kind, worker, steps_done, lease in values
        }

    def track(self, job_id: str, role: str) -> str:
        self.roles[job_id] = role
        self.order.append(job_id)
        return job_id

    def submit(self, kind: str, input: dict[str, Any], *, api: bool = False) -> str:
        """Submit a job, through the web API (as a client) or `job_submit` (as `manage.py submit`)."""
        if api:
            return self.platform.submit(kind, input)
        from jobs.services import job_submit

        return str(database_call(lambda: job_submit(kind=kind, input=input))[0].pk)

    def submit_first(self) -> None:
        """The stubborn and poison jobs first (they get a slot at once), then the reviews."""
        args = self.args
        for _ in range(args.stubborn):
            self.track(self.submit("test.stubborn", {"seconds": 120}), "stubborn")
        for _ in range(args.poison):
            self.track(self.submit("test.crash", {}), "poison")
        reviews = [self.track(self.submit("demo.review", {"document": f"chaos {n}"}, api=True), "review")
                   for n in range(args.reviews + args.cancel)]
        self.reserved_reviews = reviews[: args.cancel]
        # The others are answered one by one across the faults, so answers meet faults too.
        answered = reviews[args.cancel :]
        span = len(self.schedule()) * args.gap or args.gap
        for index, job_id in enumerate(answered):
            self.answer_at[job_id] = self.started + args.warmup + (index + 0.5) * span / max(len(answered), 1)

    def schedule(self) -> list[str]:
        return list(self.args.faults)

    def feed(self, rows: dict[str, Row]) -> None:
        """Keep `--backlog` demo.sleep jobs pending until `--jobs` were submitted."""
        from httpx import HTTPError

        args = self.args
        waiting = sum(1 for job_id, row in rows.items() if row.status == "pending" and row.kind == "demo.sleep")
        while self.sleep_submitted < args.jobs and waiting < args.backlog:
            api = bool(args.api_every) and (self.sleep_submitted + 1) % args.api_every == 0
            try:
                job_id = self.submit("demo.sleep", {"seconds": args.seconds, "steps": args.steps}, api=api)
            except (AssertionError, HTTPError):  # Platform.submit asserts a 201
                self.api_failures += 1
                return
            except DatabaseAway:
                self.submit_failures += 1
                return
            self.track(job_id, "sleep")
            self.sleep_submitted += 1
            waiting += 1

    def answer(self, rows: dict[str, Row]) -> None:
        from django.db import InterfaceError, OperationalError, connection

        from approvals.models import Question
        from approvals.services import question_answer

        now = time.time()
        for job_id, due in self.answer_at.items():
            row = rows.get(job_id)
            if job_id in self.answered or due > now or row is None or row.status != "paused":
                continue
            try:
                question = Question.objects.filter(job_id=job_id, status=Question.Status.OPEN).first()
                if question is not None:
                    question_answer(question_id=question.pk, user=self.reviewer, answer={"approved": True},
                                    channel="api")
                    self.answered.add(job_id)
            except (OperationalError, InterfaceError) as exc:
                connection.close()
                raise DatabaseAway(str(exc)) from exc
            except Exception as exc:  # recorded; the final counts show what it cost
                self.answer_errors.append(f"{job_id}: {type(exc).__name__}: {exc}")
                self.answered.add(job_id)

    def watch_cancelled_runs(self, rows: dict[str, Row]) -> None:
        now = time.time()
        for job_id, record in self.cancelled.items():
            if record["from"] == "processing" and job_id not in self.run_stopped_at and not rows[job_id].leased:
                self.run_stopped_at[job_id] = now

    # -- the faults -------------------------------------------------------------------------------
    def on_worker(self, rows: dict[str, Row], worker: Any, *, started: bool = False) -> list[str]:
        """The jobs `worker` is running (with a finished step, when `started`)."""
        prefix = self.hostnames[worker] + " "
        return [job_id for job_id, row in rows.items() if row.status == "processing"
                and row.worker.startswith(prefix) and (row.steps_done >= 1 or not started)]

    def busiest(self, rows: dict[str, Row]) -> Any:
        return max(self.job_workers, key=lambda worker: len(self.on_worker(rows, worker, started=True)))

    def fault_ready(self, name: str, rows: dict[str, Row]) -> bool:
        """Is there something for the fault to hit? (It is caused anyway after another `--gap`.)"""
        args = self.args
        sleeping = [row for row in rows.values() if row.kind == "demo.sleep"]
        if name == "cancel":
            pending = sum(1 for row in sleeping if row.status == "pending")
            running = sum(1 for row in sleeping if row.status == "processing" and 1 <= row.steps_done < args.steps - 1)
            paused = all(rows[job_id].status == "paused" for job_id in self.reserved_reviews)
            stubborn = all(rows[job_id].status == "processing" and rows[job_id].steps_done >= 1
                           for job_id, role in self.roles.items() if role == "stubborn")
            return pending >= args.cancel and running >= args.cancel and paused and stubborn
        if name in ("kill9", "sigterm"):
            return len(self.on_worker(rows, self.busiest(rows), started=True)) >= args.concurrency
        if name in ("redis", "postgres"):
            statuses = Counter(row.status for row in sleeping)
            return statuses["processing"] >= 1 and statuses["pending"] >= 1
        return True

    def fault_cancel(self, rows: dict[str, Row]) -> Fault:
        from jobs.errors import InvalidTransition
        from jobs.services import job_cancel

        args = self.args
        # (Jobs fed after `rows` was read are not in it.)
        sleeping = [job_id for job_id in reversed(self.order) if self.roles[job_id] == "sleep" and job_id in rows]
        pending = [job_id for job_id in sleeping if rows[job_id].status == "pending"][: args.cancel]
        running = [job_id for job_id in sleeping if rows[job_id].status == "processing"
                   and 1 <= rows[job_id].steps_done < args.steps - 1][: args.cancel]
        paused = [job_id for job_id in self.reserved_reviews if rows[job_id].status == "paused"]
        stubborn = [job_id for job_id, role in self.roles.items() if role == "stubborn"
                    and rows[job_id].status == "processing"]
        at = time.time()
        for job_id in [*pending, *running, *paused, *stubborn]:
            try:
                job = database_call(lambda job_id=job_id: job_cancel(job_id=job_id, channel="api"))
            except InvalidTransition as exc:  # it finished meanwhile
                print(f"  could not cancel {job_id}: {exc}")
                continue
            if job.status == "cancelled":
                self.cancelled[job_id] = {"from": rows[job_id].status, "steps_at_cancel": rows[job_id].steps_done,
                                          "at": time.time()}
        counts = Counter(record["from"] for job_id, record in self.cancelled.items() if job_id not in stubborn)
        label = f"cancel {counts['pending']}+{counts['processing']}+{counts['paused']}+{len(stubborn)} stubborn"
        return Fault("cancel", label, at, in_flight=running + stubborn,
                     detail={"pending": pending, "processing": running, "paused": paused, "stubborn": stubborn})

    def fault_kill9(self, rows: dict[str, Row]) -> Fault:
        victim = self.busiest(rows)
        in_flight = self.on_worker(rows, victim)
        at = time.time()
        victim.kill()  # SIGKILL to the worker's whole process group: the pool's children die with their jobs
        self.job_workers.remove(victim)
        self.retired.append(victim)
        replacement = self.worker_start()
        return Fault("kill9", f"kill -9 {victim.name}", at, in_flight=in_flight,
                     detail={"worker": self.hostnames[victim], "replacement": replacement.name,
                             "replacement_ready_s": round(time.time() - at, 2)})

    def fault_sigterm(self, rows: dict[str, Row]) -> Fault:
        victim = self.busiest(rows)
        in_flight = self.on_worker(rows, victim)
        at = time.time()
        victim.proc.send_signal(signal.SIGTERM)  # to the main process only, as `docker stop` does
        try:
            victim.proc.wait(timeout=60)
            exited_s: float | None = round(time.time() - at, 2)
        except subprocess.TimeoutExpired:
            exited_s = None
        victim.stop(timeout=5)  # whatever is left of its group
        self.job_workers.remove(victim)
        self.retired.append(victim)
        replacement = self.worker_start()
        label = f"SIGTERM {victim.name} (exit {exited_s} s)" if exited_s is not None else f"SIGTERM {victim.name}"
        return Fault("sigterm", label, at, in_flight=in_flight,
                     detail={"worker": self.hostnames[victim], "exited_s": exited_s, "replacement": replacement.name})

    def fault_duplicate(self, rows: dict[str, Row]) -> Fault:
        from jobs.models import Job
        from jobs.services import job_dispatch

        count = self.args.duplicates
        sleeping = [job_id for job_id in self.order
                    if self.roles[job_id] == "sleep" and job_id not in self.cancelled and job_id in rows]
        chosen: list[str] = []
        for status, share in (("pending", count // 3), ("processing", count // 3), ("completed", count)):
            share = min(share, count - len(chosen))
            chosen += [job_id for job_id in sleeping if rows[job_id].status == status][:share]
        jobs = database_call(lambda: list(Job.objects.filter(pk__in=chosen)))
        at = time.time()
        for job in jobs:
            job_dispatch(job=job)  # the `jobs.run` message, exactly as the platform sends it
        states = Counter(rows[job_id].status for job_id in chosen)
        return Fault("duplicate", f"duplicate x{len(jobs)}", at,
                     detail={"jobs": chosen, "states": dict(states)})

    def queue_messages(self) -> int:
        """Messages in the `jobs` queue: what a Redis restart loses (a delivered message is in its
        worker's hands, not in Redis: no acknowledgement emulation)."""
        import redis

        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        try:
            return client.llen(f"{self.prefix}jobs")
        except redis.RedisError:
            return -1
        finally:
            client.close()

    def fault_redis(self, rows: dict[str, Row]) -> Fault:
        in_flight = [job_id for job_id, row in rows.items() if row.status == "processing"]
        queued = [job_id for job_id, row in rows.items() if row.status == "pending"]
        messages = self.queue_messages()
        at = time.time()
        self.redis.restart_empty(down_for=self.args.down_for)
        return Fault("redis", "Redis restart, empty", at, in_flight=in_flight, queued=queued,
                     detail={"messages_lost": messages, "web_back_s": self.web_back(at)})

    def fault_postgres(self, rows: dict[str, Row]) -> Fault:
        in_flight = [job_id for job_id, row in rows.items() if row.status == "processing"]
        queued = [job_id for job_id, row in rows.items() if row.status == "pending"]
        at = time.time()
        self.pg.restart(down_for=self.args.down_for)
        return Fault("postgres", "PostgreSQL restart", at, in_flight=in_flight, queued=queued,
                     detail={"web_back_s": self.web_back(at)})

    def web_back(self, since: float, timeout: float = 30.0) -> float | None:
        """Seconds from `since` until the web server's /healthz answers 200 again."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.platform.healthz() == 200:
                return round(time.time() - since, 2)
            time.sleep(0.1)
        return None

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> bool:
        """Feed, answer and cause the faults until every job is finished; False on a timeout."""
        args = self.args
        schedule = self.schedule()
        next_at = self.started + args.warmup
        due_since: float | None = None
        deadline = self.started + args.timeout
        while time.time() < deadline:
            try:
                rows = self.rows()
                self.feed(rows)
                self.answer(rows)
                self.watch_cancelled_runs(rows)
            except DatabaseAway:
                time.sleep(TICK)
                continue
            now = time.time()
            if schedule and now >= next_at:
                due_since = due_since or now
                name = schedule[0]
                if self.fault_ready(name, rows) or now - due_since >= args.gap:
                    if not self.fault_ready(name, rows):
                        print(f"  {name}: nothing much to hit after waiting {args.gap:g} s; causing it anyway")
                    fault = getattr(self, f"fault_{name}")(rows)
                    self.faults.append(fault)
                    schedule.pop(0)
                    due_since = None
                    next_at = time.time() + args.gap
                    hit = (f"sent to jobs {fault.detail['states']}" if name == "duplicate" else
                           f"{len(fault.in_flight)} in flight{f', {len(fault.queued)} queued' if fault.queued else ''}")
                    print(f"{fault.at - self.started:7.1f} s  {fault.label}: {hit}", flush=True)
                    continue
            # Every job submitted so far (some maybe just now, after `rows` was read) is finished.
            finished = all(job_id in rows for job_id in self.order) and all(
                row.status in TERMINAL for row in rows.values())
            if not schedule and self.sleep_submitted >= args.jobs and finished:
                return True
            time.sleep(TICK)
        return False

    # -- reading back -----------------------------------------------------------------------------
    def worker_log_lines(self) -> list[tuple[str, str]]:
        return [(process.name, line) for process in self.processes() for line in list(process.lines)]

    def analyze(self, *, finished_in_time: bool) -> dict[str, Any]:
        from django.db.models import Count

        from approvals.models import Question
        from demo.models import StepRun
        from jobs.models import Job, JobEvent

        args = self.args
        jobs = {str(job["id"]): job for job in Job.objects.annotate(steps_done=Count("steps")).values(
            "id", "kind", "input", "status", "attempts", "max_attempts", "event_seq", "error", "result", "steps_done")}
        events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for job_id, seq, type_, step, status, message, created_at in JobEvent.objects.order_by("job_id", "seq") \
                .values_list("job_id", "seq", "type", "step", "status", "message", "created_at").iterator():
            events[str(job_id)].append({"seq": seq, "type": type_, "step": step, "status": status,
                                        "message": message or {}, "at": created_at.timestamp()})
        step_runs: dict[str, dict[str, int]] = defaultdict(dict)
        for job_id, step, runs in StepRun.objects.values_list("job_id", "step", "runs"):
            step_runs[str(job_id)][step] = runs
        questions = dict(Question.objects.values_list("job_id", "status"))
        problems: list[str] = []
        evidence: dict[str, Any] = {}

        # Outcomes against what each job was meant to reach.
        def expected(job_id: str) -> str:
            if job_id in self.cancelled:
                return "cancelled"
            return "failed" if self.roles.get(job_id) == "poison" else "completed"

        wrong = {job_id: (job["status"], expected(job_id)) for job_id, job in jobs.items()
                 if job["status"] in TERMINAL and job["status"] != expected(job_id)}
        unfinished = {job_id: job["status"] for job_id, job in jobs.items() if job["status"] not in TERMINAL}
        outcome = {status: {"expected": sum(1 for job_id in jobs if expected(job_id) == status),
                            "actual": sum(1 for job in jobs.values() if job["status"] == status)}
                   for status in ("completed", "cancelled", "failed")}
        if wrong:
            problems.append(f"{len(wrong)} job(s) ended other than expected")
            evidence["wrong_outcome"] = {job_id: {"status": got, "expected": want, "error": jobs[job_id]["error"]}
                                         for job_id, (got, want) in list(wrong.items())[:20]}
        if unfinished:
            problems.append(f"{len(unfinished)} job(s) never finished")
            evidence["unfinished"] = dict(list(unfinished.items())[:20])

        # Event logs: seqs 1..event_seq, no gap, no duplicate.
        gaps = [job_id for job_id, job in jobs.items()
                if [event["seq"] for event in events[job_id]] != list(range(1, job["event_seq"] + 1))]
        if gaps:
            problems.append(f"{len(gaps)} event log(s) with gaps")
            evidence["gaps"] = {job_id: {"event_seq": jobs[job_id]["event_seq"],
                                         "seqs": [event["seq"] for event in events[job_id]]} for job_id in gaps[:10]}

        # Runs lost per job: those that ended without their outcome (a dead worker's, taken back by
        # the lease; one that lost its database and handed the job back; one that failed with an
        # error and was retried). Only these may leave a step in flight that runs again.
        lost_runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        handed_back: list[dict[str, Any]] = []
        for job_id, log in events.items():
            for event in log:
                if event["type"] != "status":
                    continue
                message = event["message"]
                if message.get("lease_expired"):
                    lost_runs[job_id].append({**event, "why": "lease"})
                elif message.get("handed_back"):
                    why = "database" if "database" in str(message.get("reason", "")) else "shutdown"
                    handed_back.append({**event, "job": job_id, "why": why})
                    if why == "database":
                        lost_runs[job_id].append({**event, "why": "database"})
                elif event["status"] == "pending" and message.get("error"):
                    lost_runs[job_id].append({**event, "why": "error"})

        # Steps: a finished step never runs again; a step in flight at a lost run may.
        finished_again: list[tuple[str, str]] = []
        unstarted: list[tuple[str, str]] = []
        in_flight_reruns = 0
        over_bound: list[str] = []
        missing_steps: list[str] = []
        for job_id, job in jobs.items():
            # Only what ran inside `ctx.step` (test kinds also count code between steps, which
            # runs again on every resume by design).
            named = {event["step"] for event in events[job_id] if event["type"] == "step"}
            runs = {step: count for step, count in step_runs.get(job_id, {}).items() if step in named}
            completed_steps: set[str] = set()
            started: Counter[str] = Counter()
            for event in events[job_id]:
                if event["type"] != "step":
                    continue
                if event["status"] == "started":
                    started[event["step"]] += 1
                    if event["step"] in completed_steps:
                        finished_again.append((job_id, event["step"]))
                elif event["status"] == "completed":
                    completed_steps.add(event["step"])
            # A body runs only after its `started` event is written (fenced to the run).
            unstarted += [(job_id, step) for step, count in runs.items() if count > started[step]]
            extra = sum(count - 1 for step, count in runs.items() if count > 1
                        and (job_id, step) not in finished_again)
            in_flight_reruns += extra
            if extra > len(lost_runs[job_id]) or any(count > 1 + len(lost_runs[job_id]) for count in runs.values()):
                over_bound.append(job_id)
            steps = job["input"].get("steps", 0)
            if job["kind"] == "demo.sleep" and job["status"] == "completed" and (
                set(runs) != {str(n) for n in range(1, steps + 1)} or job["steps_done"] != steps
            ):
                missing_steps.append(job_id)
        if finished_again:
            problems.append(f"{len(finished_again)} finished step(s) ran again")
            evidence["finished_steps_ran_again"] = [
                {"job": job_id, "step": step, "runs": step_runs[job_id].get(step),
                 "events": [(e["seq"], e["type"], e["step"], e["status"]) for e in events[job_id]]}
                for job_id, step in finished_again[:5]]
        if unstarted:
            problems.append(f"{len(unstarted)} step(s) whose body ran more often than it was started")
            evidence["step_runs_without_started_event"] = [
                {"job": job_id, "step": step, "runs": step_runs[job_id][step]} for job_id, step in unstarted[:10]]
        if over_bound:
            problems.append(f"{len(over_bound)} job(s) re-ran more steps than they lost runs")
            evidence["reruns_over_bound"] = {
                job_id: {"step_runs": step_runs[job_id], "lost_runs": len(lost_runs[job_id])}
                for job_id in over_bound[:10]}
        if missing_steps:
            problems.append(f"{len(missing_steps)} completed demo.sleep job(s) without all their steps")
            evidence["missing_steps"] = {job_id: step_runs[job_id] for job_id in missing_steps[:10]}

        # Every run was claimed with an event: attempts = `processing` events.
        unclaimed = [job_id for job_id, job in jobs.items() if job["attempts"] != sum(
            1 for event in events[job_id] if event["type"] == "status" and event["status"] == "processing")]
        if unclaimed:
            problems.append(f"{len(unclaimed)} job(s) whose attempts differ from their claim events")
            evidence["attempts_without_claim_event"] = unclaimed[:10]

        # What each cancellation promised: cancelled at the end, never completed, nothing written
        # by the run after the cancel (its writes are fenced), a terminate only for a stubborn run.
        cancel_faults: list[str] = []
        writes_after_cancel = 0
        needless_terminations = 0
        for job_id, record in self.cancelled.items():
            job, runs = jobs[job_id], step_runs.get(job_id, {})
            statuses = [event["status"] for event in events[job_id] if event["type"] == "status"]
            if "completed" in statuses or statuses[-1:] != ["cancelled"]:
                cancel_faults.append(f"{job_id}: statuses {statuses}")
            cancel_seq = max((event["seq"] for event in events[job_id]
                              if event["type"] == "status" and event["status"] == "cancelled"), default=0)
            after = [event for event in events[job_id] if event["seq"] > cancel_seq]
            writes_after_cancel += sum(1 for event in after if event["type"] in ("step", "progress"))
            if self.roles[job_id] != "stubborn":
                needless_terminations += sum(
                    1 for event in after if event["type"] == "log" and "terminated" in str(event["message"]))
            if self.roles[job_id] == "stubborn":
                terminated = any(event["type"] == "log" and "terminated" in str(event["message"].get("text", ""))
                                 for event in events[job_id])
                if not terminated or "b" in runs:
                    cancel_faults.append(f"{job_id} (stubborn): terminated {terminated}, step runs {runs}")
            elif record["from"] == "pending" and (job["attempts"] != 0 or runs):
                # Claimed between the snapshot and the cancel: a processing cancel after all.
                record["from"] = "processing" if job["attempts"] else record["from"]
            elif record["from"] == "processing" and len(runs) > record["steps_at_cancel"] + 1:
                cancel_faults.append(f"{job_id}: {len(runs)} steps ran, {record['steps_at_cancel']} done at the cancel")
            elif record["from"] == "paused" and questions.get(uuid.UUID(job_id)) != "cancelled":
                cancel_faults.append(f"{job_id}: question {questions.get(uuid.UUID(job_id))}")
        if writes_after_cancel:
            problems.append(f"{writes_after_cancel} step or progress event(s) written after a cancel")
        if needless_terminations:
            cancel_faults.append(f"{needless_terminations} run(s) terminated after they had stopped by themselves")
        if cancel_faults:
            problems.append(f"{len(cancel_faults)} cancellation(s) not kept")
            evidence["cancellations"] = cancel_faults[:10]
        poison_faults = [job_id for job_id, role in self.roles.items() if role == "poison" and (
            (jobs[job_id]["error"] or {}).get("code") != "worker_lost" or step_runs[job_id].get("a") != 1)]
        if poison_faults:
            problems.append(f"{len(poison_faults)} poison job(s) did not end as worker_lost with step a run once")
            evidence["poison"] = {job_id: {"status": jobs[job_id]["status"], "error": jobs[job_id]["error"],
                                           "step_runs": step_runs[job_id]} for job_id in poison_faults}
        review_faults = [job_id for job_id in self.answered if jobs[job_id]["status"] == "completed"
                         and (jobs[job_id]["result"] or {}).get("approved") is not True]
        if review_faults:
            problems.append(f"{len(review_faults)} answered review(s) completed without the approval")

        # Per fault: attempts lost, hand-backs and the time until every job it hit moved again.
        lines = self.worker_log_lines()
        rows = [self.fault_figures(fault, events, lost_runs, handed_back, jobs, step_runs, lines)
                for fault in self.faults]
        poison_lost = sum(1 for job_id, role in self.roles.items() if role == "poison" for _ in lost_runs[job_id])
        if poison_lost:
            rows.append({"fault": "poison", "label": f"poison (test.crash x{args.poison})", "at_s": None,
                         "in_flight": None, "queued": None, "attempts_lost": poison_lost, "handed_back": 0,
                         "recovered_s": None, "recovered_p50_s": None, "not_recovered": 0, "detail": {}})

        died = self.processes_died()
        if died:
            problems.append(f"platform process(es) died: {', '.join(died)}")
        reconciler = {name: sum(int(m.group(1)) for _, line in lines if (m := pattern.search(line)))
                      for name, pattern in RECONCILER_LINES.items()}
        errors_logged = Counter(name for name, line in lines if LOG_PROBLEM.search(line))
        first_errors = [f"[{name}] {line[:300]}" for name, line in lines if LOG_PROBLEM.search(line)][:8]
        lease_events = [event for log in lost_runs.values() for event in log if event["why"] == "lease"]
        counts = {
            "submitted": len(jobs),
            "by_kind": dict(Counter(job["kind"] for job in jobs.values())),
            **outcome,
            "failed_by_code": dict(Counter((job["error"] or {}).get("code") for job in jobs.values()
                                           if job["status"] == "failed")),
            "unfinished": len(unfinished),
            "event_logs_complete": len(jobs) - len(gaps),
            "event_logs_with_gaps": len(gaps),
            "events": sum(len(log) for log in events.values()),
            "finished_steps_ran_again": len(finished_again),
            "step_runs_without_started_event": len(unstarted),
            "in_flight_reruns": in_flight_reruns,
            "lost_runs": sum(len(log) for log in lost_runs.values()),
            "reruns_over_bound": len(over_bound),
            "handed_back_at_sigterm": sum(1 for event in handed_back if event["why"] == "shutdown"),
            "handed_back_database": sum(1 for event in handed_back if event["why"] == "database"),
            "taken_back_by_lease": len(lease_events),
            "jobs_taken_back_by_lease": sum(1 for log in lost_runs.values()
                                            if any(event["why"] == "lease" for event in log)),
            "retried_after_error": sum(1 for log in lost_runs.values() for event in log if event["why"] == "error"),
            "cancelled_from": dict(Counter(record["from"] for record in self.cancelled.values())),
            "writes_after_cancel": writes_after_cancel,
            "needless_terminations": needless_terminations,
            "attempts_without_claim_event": len(unclaimed),
            "api_submitted": sum(1 for n in range(1, self.sleep_submitted + 1)
                                 if args.api_every and n % args.api_every == 0) + args.reviews + args.cancel,
            "answered_reviews": len(self.answered),
            "answer_errors": self.answer_errors[:5],
            "api_submit_failures": self.api_failures,
            "submit_failures_database_away": self.submit_failures,
            "reconciler": reconciler,
            "errors_logged": dict(errors_logged),
            "first_errors_logged": first_errors,
        }
        if not finished_in_time:
            problems.append(f"not every job finished within --timeout {args.timeout:g} s")
        return {"counts": counts, "faults": rows, "problems": problems, "evidence": evidence}

    def fault_figures(self, fault: Fault, events: dict[str, list[dict[str, Any]]],
                      lost_runs: dict[str, list[dict[str, Any]]], handed_back: list[dict[str, Any]],
                      jobs: dict[str, dict[str, Any]], step_runs: dict[str, dict[str, int]],
                      lines: list[tuple[str, str]]) -> dict[str, Any]:
        """What `fault` cost: attempts lost to it, hand-backs, and how long until every job it hit
        moved again (a status event after a worker's death or shutdown: taken back, handed back;
        any event after a restart: the run went on, or the queued job was claimed)."""
        until = min((other.at for other in self.faults if other.at > fault.at), default=float("inf"))

        def mine(event: dict[str, Any], job_id: str) -> bool:
            if self.roles.get(job_id) == "poison":
                return False
            if fault.name == "kill9":
                return fault.detail["worker"] in str(event["message"].get("error", {}).get("message", ""))
            return fault.at <= event["at"] < until and not any(
                other.name == "kill9" and other.detail["worker"] in str(event["message"].get("error", ""))
                for other in self.faults)

        lost = sum(1 for job_id, log in lost_runs.items() for event in log
                   if event["why"] in ("lease", "error") and mine(event, job_id))
        why = "shutdown" if fault.name == "sigterm" else "database"
        backs = sum(1 for event in handed_back if fault.at <= event["at"] < until and event["why"] == why)
        delays: list[float] = []
        per_job: dict[str, float | None] = {}
        not_recovered = 0
        if fault.name == "cancel":
            for job_id in fault.in_flight:
                if self.roles[job_id] == "stubborn":
                    stopped = [e["at"] for e in events[job_id]
                               if e["type"] == "log" and "terminated" in str(e["message"])]
                    moved = stopped[0] if stopped else None
                else:
                    moved = self.run_stopped_at.get(job_id)
                per_job[job_id] = None if moved is None else round(moved - fault.at, 3)
                if moved is None:
                    not_recovered += 1
                else:
                    delays.append(moved - fault.at)
        elif fault.name != "duplicate":
            wanted_type = "status" if fault.name in ("kill9", "sigterm") else None
            for job_id in [*fault.in_flight, *fault.queued]:
                after = [e["at"] for e in events[job_id]
                         if e["at"] > fault.at and (wanted_type is None or e["type"] == wanted_type)]
                per_job[job_id] = round(after[0] - fault.at, 3) if after else None
                if after:
                    delays.append(after[0] - fault.at)
                elif jobs[job_id]["status"] not in TERMINAL or fault.name in ("kill9", "sigterm"):
                    not_recovered += 1
        detail = {key: value for key, value in fault.detail.items()
                  if key not in ("jobs", "pending", "processing", "paused")}
        if fault.name == "duplicate":
            chosen = set(fault.detail["jobs"])
            skipped = sum(1 for _, line in lines if (m := NOT_CLAIMED.search(line)) and m.group(1) in chosen
                          and (log_time(line) or 0) >= fault.at - 1)
            detail["deliveries_skipped"] = skipped
            detail["jobs_with_a_step_run_twice"] = sum(
                1 for job_id in chosen if any(count > 1 for count in step_runs.get(job_id, {}).values()))
        return {
            "fault": fault.name,
            "label": fault.label,
            "at_s": round(fault.at - self.started, 1),
            "in_flight": len(fault.in_flight) if fault.name != "duplicate" else None,
            "queued": len(fault.queued) if fault.name in ("redis", "postgres") else None,
            "attempts_lost": lost if fault.name != "duplicate" else None,
            "handed_back": backs if fault.name != "duplicate" else None,
            "recovered_s": round(max(delays), 2) if delays else None,
            "recovered_p50_s": round(statistics.median(delays), 2) if delays else None,
            "not_recovered": not_recovered,
            "detail": detail,
            "moved_again_s_by_job": per_job,
        }


# -- what was measured, and on what ---------------------------------------------------------------
def setup_describe(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    import redis
    from django.conf import settings
    from django.db import connection

    client = redis.Redis.from_url(env["REDIS_URL"])
    try:
        redis_version = client.info("server").get("redis_version", "?")
    finally:
        client.close()
    connection.ensure_connection()
    major, minor = divmod(connection.pg_version, 10000)
    return {
        "code": code_revision(),
        "machine": {
            "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": platform_info.python_version(),
            "system": f"{platform_info.system()} {platform_info.machine()}",
            "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
        },
        "database": {"engine": "postgresql", "version": f"{major}.{minor}", "server": "private (bench's own)"},
        "redis": {"version": redis_version, "server": "private (bench's own), no persistence"},
        "settings": {
            "job_workers": args.workers,
            "concurrency": args.concurrency,
            "platform_worker": "concurrency 1, -Q platform",
            "lease_seconds": settings.JOBS_LEASE_SECONDS,
            "reconcile_interval": settings.JOBS_RECONCILE_INTERVAL,
            "dispatch_grace": settings.JOBS_DISPATCH_GRACE,
            "cancel_grace": settings.JOBS_CANCEL_GRACE,
            "default_max_attempts": settings.JOBS_DEFAULT_MAX_ATTEMPTS,
            "acks_late": settings.CELERY_TASK_ACKS_LATE,
            "prefetch_multiplier": settings.CELERY_WORKER_PREFETCH_MULTIPLIER,
            "settings_module": env["DJANGO_SETTINGS_MODULE"],
        },
        "workload": {
            "sleep_jobs": args.jobs, "steps": args.steps, "seconds": args.seconds, "backlog": args.backlog,
            "api_every": args.api_every, "reviews_answered": args.reviews, "cancel_per_state": args.cancel,
            "poison": args.poison, "stubborn": args.stubborn, "duplicates": args.duplicates,
            "faults": list(args.faults), "gap": args.gap, "warmup": args.warmup, "down_for": args.down_for,
        },
    }


def dash(value: Any, fmt: str = "") -> str:
    return "-" if value is None else format(value, fmt)


def table_lines(result: dict[str, Any]) -> list[str]:
    """The figures as printed (and quoted in chaos-latest.md)."""
    counts, setup = result["counts"], result["settings"]
    load = ", ".join(str(value) for value in result["machine"]["load_average_at_start"])
    work = result["workload"]
    lines = [
        f"{work['sleep_jobs']} demo.sleep ({work['steps']} steps, {work['seconds']:g} s), "
        f"{counts['by_kind'].get('demo.review', 0)} demo.review, {work['poison']} test.crash, "
        f"{work['stubborn']} test.stubborn; {setup['job_workers']} job workers x {setup['concurrency']}"
        " + platform worker, beat, uvicorn",
        f"PostgreSQL {result['database']['version']} and Redis {result['redis']['version']}, private; lease"
        f" {setup['lease_seconds']:g} s, reconcile every {setup['reconcile_interval']:g} s, dispatch grace"
        f" {setup['dispatch_grace']:g} s, cancel grace {setup['cancel_grace']:g} s; nproc {result['machine']['nproc']},"
        f" load average at start {load}",
        "",
        f"{'fault':<44}{'at s':>7}{'in flight':>11}{'queued':>8}{'lost':>6}{'handed':>8}{'moved again s':>15}",
        f"{'':<44}{'':>7}{'':>11}{'':>8}{'att.':>6}{'back':>8}{'max (p50)':>15}",
    ]
    for row in result["faults"]:
        moved = "-" if row["recovered_s"] is None else f"{row['recovered_s']:.1f} ({row['recovered_p50_s']:.1f})"
        if row["not_recovered"]:
            moved += f" {row['not_recovered']} never"
        lines.append(f"{row['label'][:43]:<44}{dash(row['at_s'], '.1f'):>7}{dash(row['in_flight']):>11}"
                     f"{dash(row['queued']):>8}{dash(row['attempts_lost']):>6}{dash(row['handed_back']):>8}{moved:>15}")
    notes = []
    for row in result["faults"]:
        detail = row["detail"]
        if row["fault"] == "duplicate":
            notes.append(f"duplicates: {sum(detail['states'].values())} sent to jobs {detail['states']};"
                         f" {detail['deliveries_skipped']} deliveries of these jobs since (the reconciler's"
                         " re-sends too) found the job taken and did nothing")
        if row["fault"] in ("redis", "postgres") and detail.get("web_back_s") is not None:
            lost = f", {detail['messages_lost']} queue messages lost" if "messages_lost" in detail else ""
            notes.append(f"{row['label']}: web /healthz 200 again after {detail['web_back_s']:.1f} s{lost}")
    lines += ["", *notes, ""] if notes else [""]

    def count_line(label: str, value: Any, note: str = "") -> str:
        return f"{label:<36}{value!s:>10}   {note}".rstrip()

    reconciler = counts["reconciler"]
    lines += [
        count_line("jobs submitted", counts["submitted"]),
        *(count_line(status, f"{counts[status]['actual']}", f"expected {counts[status]['expected']}")
          for status in ("completed", "cancelled", "failed")),
        count_line("still unfinished", counts["unfinished"], "must be 0"),
        count_line("event logs complete", counts["event_logs_complete"], f"({counts['events']} events)"),
        count_line("event logs with gaps", counts["event_logs_with_gaps"], "must be 0"),
        count_line("finished steps that ran again", counts["finished_steps_ran_again"], "must be 0"),
        count_line("in-flight re-runs", counts["in_flight_reruns"],
                   f"at most one per lost run ({counts['lost_runs']} lost); over that: {counts['reruns_over_bound']}"),
        count_line("jobs handed back at SIGTERM", counts["handed_back_at_sigterm"]),
        count_line("handed back, database lost", counts["handed_back_database"]),
        count_line("taken back by lease expiry", counts["taken_back_by_lease"],
                   f"runs, of {counts['jobs_taken_back_by_lease']} jobs"),
        count_line("retried after an error", counts["retried_after_error"]),
        count_line("reconciler re-dispatched", reconciler["redispatched"],
                   f"took back {reconciler['taken_back']}, terminated {reconciler['terminated']}"),
        count_line("step/progress writes after a cancel", counts["writes_after_cancel"], "must be 0"),
        count_line("cancelled from", ", ".join(f"{k} {v}" for k, v in sorted(counts["cancelled_from"].items())) or "-"),
        count_line("API submissions refused (retried)", counts["api_submit_failures"],
                   f"of {counts['api_submitted']} through the web API"),
        count_line("failed by code", ", ".join(f"{k} {v}" for k, v in counts["failed_by_code"].items()) or "-"),
        count_line("ERROR lines in the processes' logs",
                   sum(counts["errors_logged"].values()),
                   ", ".join(f"{k} {v}" for k, v in sorted(counts["errors_logged"].items()))),
        "",
        ("result: nothing lost, nothing repeated" if not result["problems"]
         else "result: FAILED: " + "; ".join(result["problems"])),
    ]
    return lines


def results_write(result: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(result["date"]).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"chaos-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    latest_write()
    return path


def latest_write() -> None:
    """Rewrite chaos-latest.md from the newest result."""
    newest: dict[str, Any] | None = None
    for path in RESULTS_DIR.glob("chaos-*.json"):
        try:
            result = json.loads(path.read_text())
            result["date"], result["counts"]  # noqa: B018 (a result of this bench)
        except (ValueError, KeyError, TypeError):
            continue
        if newest is None or result["date"] > newest["date"]:
            newest = result
    if newest is None:
        return
    code = newest.get("code", {})
    machine = newest["machine"]
    lines = [
        "# Chaos: the chaos suite's faults at a larger size",
        "",
        "Written by `bench/chaos.py` (see `bench/README.md`): the newest run.",
        "",
        f"- date: {newest['date']}; code: {code.get('commit')}{' with local changes' if code.get('dirty') else ''}",
        f"- machine: nproc {machine['nproc']}, {machine['system']}, Python {machine['python']},"
        f" load average at start {', '.join(str(value) for value in machine['load_average_at_start'])}",
        f"- took {newest['seconds']:.0f} s; exit status {0 if not newest['problems'] else 1}",
        "",
        "```",
        *table_lines(newest),
        "```",
    ]
    (RESULTS_DIR / "chaos-latest.md").write_text("\n".join(lines) + "\n")


# -- main -----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--jobs", type=int, default=200, help="demo.sleep jobs (default 200)")
    add("--steps", type=int, default=4, help="steps of each demo.sleep job (default 4)")
    add("--seconds", type=float, default=3.0, help="seconds each demo.sleep job sleeps in all (default 3)")
    add("--backlog", type=int, default=8, help="demo.sleep jobs kept pending while feeding (default 8)")
    add("--api-every", type=int, default=4, help="submit every Nth demo.sleep job through the web API (0: never)")
    add("--reviews", type=int, default=10, help="demo.review jobs answered along the way (default 10)")
    add("--cancel", type=int, default=3, help="jobs cancelled in each state: pending, processing, paused (default 3)")
    add("--poison", type=int, default=2, help="test.crash jobs that kill their worker process (default 2)")
    add("--stubborn", type=int, default=1, help="test.stubborn runs cancelled and terminated (default 1)")
    add("--duplicates", type=int, default=30, help="jobs whose message is sent again (default 30)")
    add("--workers", type=int, default=2, help="job workers (default 2)")
    add("--concurrency", type=int, default=2, help="pool processes per job worker (default 2)")
    add("--lease", type=float, default=3.0, help="JOBS_LEASE_SECONDS (default 3)")
    add("--reconcile", type=float, default=0.5, help="JOBS_RECONCILE_INTERVAL (default 0.5)")
    add("--grace", type=float, default=8.0, help="JOBS_DISPATCH_GRACE (default 8)")
    add("--cancel-grace", type=float, default=2.0, help="JOBS_CANCEL_GRACE (default 2)")
    add("--faults", default=",".join(FAULTS), help=f"which faults, in this order (default {','.join(FAULTS)})")
    add("--warmup", type=float, default=10.0, help="seconds before the first fault (default 10)")
    add("--gap", type=float, default=15.0, help="seconds between two faults (default 15)")
    add("--down-for", type=float, default=1.0, help="seconds Redis and PostgreSQL stay down (default 1)")
    add("--timeout", type=float, default=900.0, help="give up on the run after S seconds (default 900)")
    add("--no-write", action="store_true", help="print only; write nothing to bench/results")
    args = parser.parse_args(argv)
    args.faults = [name.strip() for name in args.faults.split(",") if name.strip()]
    unknown = set(args.faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; choose from {','.join(FAULTS)}")
    for name in ("jobs", "steps", "workers", "concurrency", "backlog"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.workers < 2 and {"kill9", "sigterm"} & set(args.faults):
        print("note: with one job worker, the jobs wait for its replacement after kill -9 and SIGTERM")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = environment_prepare(args)

    import django

    django.setup()
    from tests.chaos.servers import PrivatePostgres

    reason = PrivatePostgres.unavailable()
    if reason:
        print(f"bench failed: no private PostgreSQL cluster: {reason}", file=sys.stderr)
        return 2
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    counter = logging_to_file(LOG_DIR / "bench.log")
    workdir = Path(tempfile.mkdtemp(prefix="chaos-bench-"))
    # Not under `workdir`'s parents' rules: the cluster runs as the `postgres` user.
    pg_root = Path(tempfile.mkdtemp(prefix="chaos-bench-pg-"))
    bench = ChaosBench(args, workdir, pg_root)
    started = time.time()
    result: dict[str, Any] = {"bench": "chaos", "date": datetime.now(UTC).replace(microsecond=0).isoformat()}
    try:
        print(f"starting PostgreSQL, Redis, {args.workers} job workers, a platform worker, beat and uvicorn"
              f" (logs: {LOG_DIR.relative_to(BASE_DIR)}/)", flush=True)
        bench.start()
        result.update(setup_describe(args, env))
        bench.started = time.time()
        print(f"ready in {bench.started - started:.1f} s; submitting and causing: {', '.join(args.faults)}",
              flush=True)
        bench.submit_first()
        finished = bench.run()
        print(f"{time.time() - bench.started:7.1f} s  {'every job finished' if finished else 'TIMEOUT'}", flush=True)
        time.sleep(2.0)  # cancelled runs wind down, the last events are written
        result.update(database_call(lambda: bench.analyze(finished_in_time=finished)))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 2
    finally:
        bench.stop()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    result["seconds"] = round(time.time() - started, 1)
    result["bench_log_warnings"] = counter.count
    print()
    for line in table_lines(result):
        print(line)
    if result["evidence"]:
        print(f"\nevidence: {json.dumps(result['evidence'], default=str)[:3000]}")
    if not args.no_write:
        path = results_write(result)
        print(f"\nwrote {path.relative_to(BASE_DIR)} and {(RESULTS_DIR / 'chaos-latest.md').relative_to(BASE_DIR)}")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
