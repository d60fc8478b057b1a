"""A worker's timer: what the time limits of finished jobs cost its main process, kept and dropped.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python bench/worker_timer.py [--count 20000]

Celery puts each task's time limit on the worker's timer, a heap in its main process, and cancels
the entry when the task ends; a cancelled entry stays in the heap until its time would have come
(JOBS_TIME_LIMIT, an hour as shipped). `ops.signals.timer_compact` drops them every
WORKER_TIMER_COMPACT_INTERVAL seconds (60 as shipped). Two parts:

1. **In one process**, kombu's timer with one entry per task set and cancelled as Celery's prefork
   pool does (`call_later` of the soft limit, then `cancel`): the bytes each held entry costs
   (tracemalloc) and a full garbage collection's time with the entries a worker running
   `--rate` jobs a second holds without the compaction (rate × JOBS_TIME_LIMIT) and with it
   (rate × WORKER_TIMER_COMPACT_INTERVAL, at most).
2. **A real worker** (`celery -A taskplatform worker`, 2 pool processes, the platform's settings)
   runs `--count` no-op jobs twice, first with the compaction off (an interval longer than the
   run), then on (every 2 s): its main process's RSS before and after.

Prints both and writes `bench/results/worker-timer-<UTC timestamp>.json`.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import results_save, run_header  # noqa: E402

QUEUE = "bench-timer"


def held_entries(count: int) -> Any:
    """A kombu timer holding `count` cancelled time limits, set and cancelled as Celery's prefork
    pool does for each task (`AsynPool.on_timeout_set` and `on_timeout_cancel`)."""
    from weakref import WeakValueDictionary

    from kombu.asynchronous.timer import Timer

    timer, trefs = Timer(), WeakValueDictionary()

    def soft_limit(*args: Any) -> None:
        pass

    for job in range(count):
        trefs[job] = timer.call_after(3600, soft_limit, (job, 3600, 3660, None))
        trefs.pop(job).cancel()
    return timer


def in_process(rate: float, limit: float, interval: float) -> dict[str, Any]:
    from ops.signals import timer_compact

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    sample = held_entries(10_000)
    per_entry = (tracemalloc.get_traced_memory()[0] - before) / 10_000
    tracemalloc.stop()
    del sample
    figures: dict[str, Any] = {"bytes_per_entry": round(per_entry)}
    for name, count in (("kept", int(rate * limit)), ("compacted", int(rate * min(interval, limit)))):
        timer = held_entries(count)
        pauses = []
        for _ in range(5):
            started = time.perf_counter()
            gc.collect()
            pauses.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        dropped = timer_compact(timer)
        compact_ms = (time.perf_counter() - started) * 1000
        figures[name] = {"entries": count, "megabytes": round(count * per_entry / 2**20, 1),
                         "full_gc_ms": round(statistics.median(pauses), 1),
                         "compaction_ms": round(compact_ms, 1), "dropped": dropped}
        del timer
        gc.collect()
    return figures


def worker_run(count: int, interval: float) -> dict[str, Any]:
    """`count` no-op jobs through a real worker whose compaction runs every `interval` seconds."""
    import psutil
    from django.db.models import Q

    from jobs.models import Job
    from jobs.services import jobs_submit_many
    from jobs.tasks import job_run

    env = {**os.environ, "WORKER_TIMER_COMPACT_INTERVAL": str(interval), "DJANGO_SETTINGS_MODULE":
           "taskplatform.settings.development"}
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "taskplatform", "worker", "-Q", QUEUE,
                               "--concurrency", "2", "--loglevel", "WARNING", "--without-mingle", "--without-gossip",
                               "--hostname", f"timer-{os.getpid()}@%h"], cwd=BASE_DIR, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        main = psutil.Process(worker.pid)

        def run(n: int) -> float:
            from unittest import mock

            started = time.perf_counter()
            ids = []
            for start in range(0, n, 500):
                with mock.patch("jobs.services.transitions.jobs_dispatch"):  # sent below, to this queue
                    jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * min(500, n - start))
                for job in jobs:
                    job_run.apply_async(args=[str(job.pk)], shadow=job.kind, queue=QUEUE)
                ids += [job.pk for job in jobs]
            deadline = time.monotonic() + 600
            while Job.objects.filter(Q(pk__in=ids) & ~Q(status="completed")).exists():
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit("bench: the worker did not run its jobs")
                time.sleep(0.5)
            return time.perf_counter() - started

        run(200)  # the pool processes started and connected
        time.sleep(2 * min(interval, 5) + 1)
        before = main.memory_info().rss
        seconds = run(count)
        time.sleep(2 * min(interval, 5) + 1)  # a compaction after the last job, when it is on
        after = main.memory_info().rss
        return {"interval_s": interval, "jobs": count, "seconds": round(seconds, 1),
                "main_rss_before_mb": round(before / 2**20, 1), "main_rss_after_mb": round(after / 2**20, 1),
                "main_rss_growth_mb": round((after - before) / 2**20, 1)}
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="jobs through the real worker, each run")
    parser.add_argument("--rate", type=float, default=100.0, help="jobs a second, for the in-process figures")
    parser.add_argument("--no-worker", action="store_true", help="the in-process part only")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    limit, interval = float(settings.JOBS_TIME_LIMIT), settings.WORKER_TIMER_COMPACT_INTERVAL
    result: dict[str, Any] = {**run_header(), "time_limit_s": limit, "compact_interval_s": interval,
                              "rate": args.rate, "in_process": in_process(args.rate, limit, interval)}
    figures = result["in_process"]
    print(f"one held entry: {figures['bytes_per_entry']} bytes")
    for name in ("kept", "compacted"):
        part = figures[name]
        print(f"{name:>9}: {part['entries']:>9,} entries at {args.rate:g} jobs/s, {part['megabytes']:>6} MB, "
              f"a full GC {part['full_gc_ms']} ms; one compaction of them {part['compaction_ms']} ms")
    if not args.no_worker:
        call_command("migrate", verbosity=0)
        result["worker"] = [worker_run(args.count, 86_400.0), worker_run(args.count, 2.0)]
        for run in result["worker"]:
            print(f"real worker, compaction every {run['interval_s']:g} s: {run['jobs']} jobs in {run['seconds']} s, "
                  f"main process {run['main_rss_before_mb']} → {run['main_rss_after_mb']} MB "
                  f"(+{run['main_rss_growth_mb']} MB)")
    if not args.no_write:
        print(results_save("worker-timer", result["when"], result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
