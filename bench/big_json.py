"""What a job's events and steps cost when its JSON is big: the input, and the checkpoint its steps
fill.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python bench/big_json.py [--events 60] [--steps 120]

In one process, on the platform's own tables (migrated here), no worker and no Celery: the moves
a run makes, called as a run calls them.

1. **Events.** A claimed job appends `--events` log lines (`jobs.events.event_append`, what
   `ctx.log` and `ctx.progress` do), once with an empty input and once with an input of
   `--input-kb` (a list of small objects: JSON as a document's rows would be), alternating, twice
   each. For each: CPU (this process's) and wall time per event, medians.
2. **Steps.** A claimed job with an empty input runs `--steps` steps (`step_begin` and
   `step_checkpoint`, what `ctx.step` does), each storing a result of `--step-kb`: CPU and wall time
   per step, and on PostgreSQL the write-ahead log it wrote (the server's: run it with nothing else
   writing), at the start, in the middle and at the end, as the checkpoint grows.

Writes `bench/results/big-json-<UTC timestamp>.json` (`--no-write`: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import results_save, run_header  # noqa: E402


def document(kb: int) -> dict[str, Any]:
    """A JSON object of about `kb` kilobytes: rows of small objects."""
    rows = max(kb * 1024 // 72, 1)
    return {"rows": [{"id": index, "name": f"item {index}", "tags": ["a", "b"], "score": index / 2}
                     for index in range(rows)]}


def _claimed(input: dict[str, Any]) -> Any:
    """A `demo.noop` job holding `input`, claimed here (no worker sees it: nothing is sent)."""
    from jobs.models import Job
    from jobs.services import job_claim, job_submit

    with mock.patch("jobs.services.transitions.job_dispatch"):
        job, _ = job_submit(kind="demo.noop", input={})
    Job.objects.filter(pk=job.pk).update(input=input)  # past the kind's schema: the bench's input
    return job_claim(job_id=job.pk, worker="bench", task_id="bench")


def events_timed(input: dict[str, Any], count: int) -> dict[str, float]:
    """CPU and wall ms per event of `count` log lines of one claimed job holding `input`."""
    from jobs.events import event_append

    job = _claimed(input)
    cpu, wall = [], []
    for index in range(count):
        started_cpu, started = time.process_time(), time.perf_counter()
        event_append(job_id=job.pk, type="log", message={"text": f"line {index}"}, run_attempt=job.attempts)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return {"cpu_ms_per_event": round(statistics.median(cpu) * 1000, 3),
            "wall_ms_per_event": round(statistics.median(wall) * 1000, 3)}


def steps_timed(count: int, step_kb: int) -> list[dict[str, Any]]:
    """CPU and wall ms per step of `count` steps of one claimed job, each storing `step_kb` of
    JSON: the medians of the first, middle and last tenth, with the checkpoint's size then."""
    from jobs.events import step_begin, step_checkpoint

    job = _claimed({})
    value = document(step_kb)
    size = len(json.dumps({"s0": value}))
    cpu, wall, wal = [], [], []
    for index in range(count):
        wal_before = _wal_position()
        started_cpu, started = time.process_time(), time.perf_counter()
        step_begin(job_id=job.pk, run_attempt=job.attempts, step=f"s{index}")
        step_checkpoint(job_id=job.pk, run_attempt=job.attempts, step=f"s{index}", value=value)
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started)
        if wal_before is not None:
            wal.append(_wal_position() - wal_before)
    tenth = max(count // 10, 1)
    spans = [(0, tenth), (count // 2 - tenth // 2, count // 2 - tenth // 2 + tenth), (count - tenth, count)]
    return [{"steps": f"{start + 1}-{end}", "checkpoint_kb": round(size * end / 1024),
             "cpu_ms_per_step": round(statistics.median(cpu[start:end]) * 1000, 3),
             "wall_ms_per_step": round(statistics.median(wall[start:end]) * 1000, 3),
             **({"wal_kb_per_step": round(statistics.median(wal[start:end]) / 1024, 1)} if wal else {})}
            for start, end in spans]


def _wal_position() -> int | None:
    """Where PostgreSQL's write-ahead log is, in bytes (the whole server's: run this bench with
    nothing else writing), or None on another database."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def measure(*, events: int, input_kb: int, steps: int, step_kb: int) -> dict[str, Any]:
    big = document(input_kb)
    sides: dict[str, list[dict[str, float]]] = {"empty input": [], f"{input_kb} kB input": []}
    for _ in range(2):
        sides["empty input"].append(events_timed({}, events))
        sides[f"{input_kb} kB input"].append(events_timed(big, events))
    return {**run_header(), "events": events, "input_bytes": len(json.dumps(big)),
            "events_per_input": {name: {key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]}
                                 for name, runs in sides.items()},
            "step_kb": step_kb, "steps": steps_timed(steps, step_kb) if steps else []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=60, help="log lines a job appends, each way")
    parser.add_argument("--input-kb", type=int, default=850, help="the big input's size")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-kb", type=int, default=10, help="each step's result's size")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    result = measure(events=args.events, input_kb=args.input_kb, steps=args.steps, step_kb=args.step_kb)
    print(f"{result['when']}, {result['revision']}, {result['machine']}")
    for name, figures in result["events_per_input"].items():
        print(f"  an event, {name}: {figures['cpu_ms_per_event']} ms CPU, {figures['wall_ms_per_event']} ms wall")
    for row in result["steps"]:
        wal = f", {row['wal_kb_per_step']} kB of WAL" if "wal_kb_per_step" in row else ""
        print(f"  steps {row['steps']} (checkpoint about {row['checkpoint_kb']} kB): {row['cpu_ms_per_step']} ms CPU, "
              f"{row['wall_ms_per_step']} ms wall{wal} per step")
    if not args.no_write:
        print(f"written: {results_save('big-json', result['when'], result).relative_to(BASE_DIR)}")


if __name__ == "__main__":
    main()
