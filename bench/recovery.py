"""Recovery bench: how soon jobs move again after the faults that used to wait out a timer, and
whether a long queue stays the size it is.

    python bench/recovery.py [--backlog 20000] [--passes 6]

It starts a PostgreSQL cluster and a Redis server of its own (`tests/chaos/servers.py`, on free
ports), migrates, and runs the platform as deployed (one job worker with one pool process, a
platform worker for beat's upkeep, Celery beat, uvicorn) with the platform's DEFAULT timings:
a 60 s lease, the reconciler every 10 s, a 30 s dispatch grace. Then:

1. **Redis restarts empty** while 10 jobs wait in the queue behind a busy job: seconds from the
   restart (Redis answering again) until they run: the busy job is over by then, so this is the
   time to notice the loss and re-send, plus the processes' reconnection (at most about one
   reconciler interval). Before the broker's epoch was watched, they waited the whole grace.
2. **A pool process is killed** (kill -9) in the middle of a 30 s job: seconds until the job runs
   again. Before the worker's main process took it back, it waited for the 60 s lease.
3. **A backlog**: `--backlog` jobs queued behind a busy worker, and `--passes` reconciler passes,
   each after a grace (2 s here): the most `jobs.run` messages the broker held above the jobs
   that need one (the aim: a small constant, not one more message per job per grace).

Writes bench/results/recovery-<UTC timestamp>.json and rewrites recovery-latest.md; the
processes' output goes to var/recovery/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import code_revision, results_save  # noqa: E402

DATABASE = "recovery_bench"
LOG_DIR = BASE_DIR / "var" / "recovery"


def port_free() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for {what}")


def environment_prepare() -> None:
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "taskplatform.settings.test",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port_free()}/{DATABASE}",
        "REDIS_URL": f"redis://127.0.0.1:{port_free()}/0",
        "REDIS_KEY_PREFIX": f"recovery-{uuid.uuid4().hex[:8]}:",
        "DJANGO_DEBUG": "false",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    })
    for name in ("JOBS_LEASE_SECONDS", "JOBS_RECONCILE_INTERVAL", "JOBS_DISPATCH_GRACE"):
        os.environ.pop(name, None)  # the platform's defaults


def seconds(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 2), "max": round(max(values), 2)}


def redis_restart(platform, redis_server, submit) -> dict:
    from jobs.models import Job

    busy = submit("demo.sleep", {"seconds": 4, "steps": 4})
    wait_for(lambda: Job.objects.filter(pk=busy, status="processing").exists(), 60, "the busy job")
    queued = [submit("demo.noop", {}) for _ in range(10)]
    redis_server.restart_empty(down_for=1.0)
    restarted = datetime.now(UTC)
    wait_for(lambda: Job.objects.filter(pk__in=queued, status="completed").count() == len(queued), 180,
             "the queued jobs after the Redis restart", interval=0.25)
    jobs = list(Job.objects.filter(pk__in=queued))
    early = [job.pk for job in jobs if job.started_at < restarted]
    if early:
        raise SystemExit(f"{len(early)} queued job(s) ran before the restart: make the busy job longer")
    return {"running_again_after_s": seconds([(job.started_at - restarted).total_seconds() for job in jobs])}


def pool_process_killed(submit) -> dict:
    from jobs.models import Job

    job_id = submit("demo.sleep", {"seconds": 30, "steps": 30})
    job = wait_for(lambda: Job.objects.filter(pk=job_id, status="processing", steps__name="2").first(), 60,
                   "the long job's second step")
    pid = int(job.worker.rsplit(" pid ", 1)[1])
    os.kill(pid, signal.SIGKILL)
    killed = datetime.now(UTC)
    again = wait_for(lambda: Job.objects.filter(pk=job_id, status="processing", attempts=2).first(), 120,
                     "the job to run again after the kill", interval=0.05)
    taken = again.events.filter(type="status", status="pending", message__process_lost=True).first()
    return {"taken_back_after_s": round((taken.created_at - killed).total_seconds(), 2) if taken else None,
            "running_again_after_s": round((again.started_at - killed).total_seconds(), 2),
            "error": (again.error or {}).get("code")}


def backlog(size: int, passes: int, submit) -> dict:
    from jobs.broker import job_messages
    from jobs.models import Job
    from jobs.services import jobs_redispatch_stale, jobs_submit_many

    busy = submit("demo.sleep", {"seconds": 600, "steps": 600})
    wait_for(lambda: Job.objects.filter(pk=busy, status="processing").exists(), 60, "the busy job")
    started = time.monotonic()
    for start in range(0, size, 5000):
        jobs_submit_many(kind="demo.noop", inputs=[{}] * min(5000, size - start))
    submitted_in = time.monotonic() - started
    excess, sent = [], []
    for _ in range(passes):
        time.sleep(2.2)
        sent.append(jobs_redispatch_stale(grace=2.0))
        need = Job.objects.filter(status__in=["pending", "processing"]).count()
        excess.append(job_messages() - need)
    Job.objects.filter(pk=busy).update(status="cancelled")  # the bench ends here; no need to wait
    return {"jobs": size, "submitted_in_s": round(submitted_in, 1), "passes": passes, "re_sent": sent,
            "most_messages_above_need": max(excess)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--passes", type=int, default=6)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    environment_prepare()

    import django

    django.setup()
    from django.core.management import call_command

    from tests.chaos.servers import Platform, PrivatePostgres, PrivateRedis
    from tests.support.processes import celery_worker

    reason = PrivatePostgres.unavailable()
    if reason:
        raise SystemExit(f"no private PostgreSQL cluster: {reason}")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="recovery-bench-"))
    redis_server = PrivateRedis(workdir / "redis", port=urlsplit(os.environ["REDIS_URL"]).port)
    pg_root = Path(tempfile.mkdtemp(prefix="recovery-bench-pg-"))
    pg = PrivatePostgres(pg_root, port=urlsplit(os.environ["DATABASE_URL"]).port)
    processes = []
    result = {"bench": "recovery", "date": datetime.now(UTC).replace(microsecond=0).isoformat(),
              "revision": code_revision(), "timings": "platform defaults (lease 60 s, reconciler 10 s, grace 30 s)"}
    try:
        redis_server.start()
        pg.start()
        pg.create_database(DATABASE)
        call_command("migrate", interactive=False, verbosity=0)
        platform = Platform(database_url=os.environ["DATABASE_URL"], redis_url=os.environ["REDIS_URL"],
                            workdir=workdir, prefix=os.environ["REDIS_KEY_PREFIX"], concurrency=1)
        platform.worker = celery_worker(concurrency=1, queues="platform", name="recovery-platform", env=platform.env)
        platform.start()
        jobs_worker = celery_worker(concurrency=1, queues="jobs", name="recovery-jobs", env=platform.env).start()
        processes = [*platform.processes, jobs_worker]
        platform.api_token()
        print("ready; 1. Redis restarts empty", flush=True)
        result["redis_restart"] = redis_restart(platform, redis_server, platform.submit)
        print(f"   {result['redis_restart']}\n2. a pool process is killed", flush=True)
        result["pool_process_killed"] = pool_process_killed(platform.submit)
        print(f"   {result['pool_process_killed']}\n3. a backlog of {args.backlog}", flush=True)
        result["backlog"] = backlog(args.backlog, args.passes, platform.submit)
        print(f"   {result['backlog']}", flush=True)
    finally:
        for process in processes:
            try:
                (LOG_DIR / f"{process.name}.log").write_text(process.output)
                process.stop(timeout=10)
            except Exception:  # noqa: BLE001 (best effort at the end)
                pass
        redis_server.stop()
        pg.destroy()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if not args.no_write:
        r, k, b = result["redis_restart"], result["pool_process_killed"], result["backlog"]
        results_save("recovery", result["date"], result, latest=(
            "# Recovery (`bench/recovery.py`)\n\n"
            f"{result['date']}, revision {result['revision']['commit']}, {result['timings']}.\n\n"
            "| fault | figure |\n| --- | --- |\n"
            "| Redis restarts empty, 10 jobs queued behind a 4 s job | running again "
            f"{r['running_again_after_s']['p50']} s (p50), {r['running_again_after_s']['max']} s (max) after the "
            "restart (aim: under 15 s) |\n"
            f"| a pool process killed mid-job | taken back {k['taken_back_after_s']} s and running again "
            f"{k['running_again_after_s']} s after the kill, in the new pool process Celery starts (aim: under 5 s; "
            "the lease is 60 s) |\n"
            f"| {b['jobs']:,} jobs queued behind a busy worker, {b['passes']} reconciler passes past the grace | "
            f"at most {b['most_messages_above_need']} message(s) above the jobs that need one; re-sent per pass: "
            f"{b['re_sent']} |\n"
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
