"""Wake bench: how fast a callback turns a parked job back into a running one, and how many checks
a generation costs.

    python bench/wake.py [--jobs 200] [--natural 50] [--concurrency 2]

It starts uvicorn (the wake route and the simulated generation service), one Celery worker and
Celery beat, as a deployment does, with PUBLIC_URL pointing at that uvicorn. Then:

1. latency: `--jobs` `demo.generate` jobs with `delay` 0 and `drop_callback`, so each parks with
   its generation already done and nobody calling back. Once all are `waiting`, the bench plays
   the service: it POSTs each job's wake URL (read from the simulator's state), one at a time,
   and measures from just before the POST to the job's `processing` event (p50, p99, max);
2. checks per generation: `--natural` `demo.generate` jobs with `delay` 0.5, where the simulated
   service calls back by itself: `check` calls per completed generation (the aim is 1.0).

Uses DATABASE_URL and REDIS_URL when set (else the embedded Redis and var/bench.sqlite3), and a
Redis key prefix of its own. Writes bench/results/wake-<UTC timestamp>.json and wake-latest.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import RESULTS_DIR, prepare_environment  # noqa: E402

VENV_BIN = Path(sys.executable).parent
AIM_P99_MS = 50.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(name: str, argv: list[str]) -> subprocess.Popen:
    log = open(BASE_DIR / "var" / f"bench-wake-{name}.log", "wb")  # noqa: SIM115 (lives as long as the process)
    return subprocess.Popen(argv, cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="parked jobs woken one by one for the latency")
    parser.add_argument("--natural", type=int, default=50, help="jobs completed through the simulator's callbacks")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    setup = prepare_environment()
    port = free_port()
    os.environ["PUBLIC_URL"] = f"http://127.0.0.1:{port}"
    (BASE_DIR / "var").mkdir(exist_ok=True)

    import django

    django.setup()
    import httpx
    from django.core.management import call_command

    from demo.simulator import generation_get
    from jobs.models import Job, JobEvent
    from jobs.services import job_submit
    from waits.models import Wait

    call_command("migrate", verbosity=0)
    processes = [
        start("uvicorn", [str(VENV_BIN / "uvicorn"), "taskplatform.asgi:application", "--host", "127.0.0.1",
                          "--port", str(port), "--lifespan", "off", "--log-level", "warning"]),
        start("worker", [str(VENV_BIN / "celery"), "-A", "taskplatform", "worker", "--loglevel", "WARNING",
                         "--concurrency", str(args.concurrency), "--without-mingle", "--without-gossip"]),
        start("beat", [str(VENV_BIN / "celery"), "-A", "taskplatform", "beat", "--loglevel", "WARNING",
                       "-s", str(BASE_DIR / "var" / "bench-wake-beat-schedule")]),
    ]
    try:
        wait_for(lambda: _answers(httpx, os.environ["PUBLIC_URL"]), 30, "uvicorn")
        # 1. latency from callback to running.
        jobs = [job_submit(kind="demo.generate", input={"prompt": f"p{i}", "delay": 0, "drop_callback": True})[0]
                for i in range(args.jobs)]
        ids = [job.pk for job in jobs]
        wait_for(lambda: Job.objects.filter(pk__in=ids, status="waiting").count() == len(ids), 300, "parking")
        latencies, answered = [], []
        logging.getLogger("httpx").setLevel(logging.WARNING)
        with httpx.Client(timeout=10) as client:
            for wait in Wait.objects.filter(job_id__in=ids):
                url = generation_get(wait.external_id)["callback_url"]
                sent = datetime.now(UTC)
                if client.post(url).status_code != 202:
                    raise SystemExit(f"wake of job {wait.job_id} refused")
                answered.append((datetime.now(UTC) - sent).total_seconds() * 1000)
                event = wait_for(lambda w=wait, s=sent: JobEvent.objects.filter(
                    job_id=w.job_id, type="status", status="processing", created_at__gt=s).first(), 30, "a run")
                latencies.append((event.created_at - sent).total_seconds() * 1000)
        wait_for(lambda: Job.objects.filter(pk__in=ids, status="completed").count() == len(ids), 120, "completion")
        # 2. checks per generation when the service calls back by itself.
        natural = [job_submit(kind="demo.generate", input={"prompt": f"n{i}", "delay": 0.5})[0].pk
                   for i in range(args.natural)]
        wait_for(lambda: Job.objects.filter(pk__in=natural, status="completed").count() == len(natural), 300,
                 "the natural jobs")
        checks = list(Wait.objects.filter(job_id__in=natural).values_list("checks", flat=True))
    finally:
        for proc in processes:
            stop(proc)

    result = {
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "database": os.environ["DATABASE_URL"].split(":", 1)[0], **setup,
        "jobs": args.jobs, "concurrency": args.concurrency,
        "wake_to_running_ms": {"p50": round(statistics.median(latencies), 2),
                               "p99": round(percentile(latencies, 0.99), 2), "max": round(max(latencies), 2)},
        "wake_answered_ms": {"p50": round(statistics.median(answered), 2), "p99": round(percentile(answered, 0.99), 2)},
        "natural_jobs": args.natural, "checks_per_generation": round(sum(checks) / len(checks), 3),
    }
    latency = result["wake_to_running_ms"]
    verdict = "meets" if latency["p99"] <= AIM_P99_MS else "misses"
    table = (
        f"| jobs | p50 ms | p99 ms | max ms | wake answered p50 / p99 ms | checks per generation |\n"
        f"|---|---|---|---|---|---|\n"
        f"| {args.jobs} | {latency['p50']} | {latency['p99']} | {latency['max']} | "
        f"{result['wake_answered_ms']['p50']} / {result['wake_answered_ms']['p99']} | "
        f"{result['checks_per_generation']} |\n\n"
        f"Callback to running, p99 {latency['p99']} ms: {verdict} the aim of {AIM_P99_MS:g} ms "
        f"({result['database']}, {setup['redis_kind']} Redis, worker concurrency {args.concurrency}).\n"
    )
    print(table)
    if not args.no_write:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / f"wake-{result['when']}.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS_DIR / "wake-latest.md").write_text(f"# Wake bench, {result['when']}\n\n{table}")


def _answers(httpx, url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
