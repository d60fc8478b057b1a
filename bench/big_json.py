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

3. **Answers.** `--answers` paused `demo.review` jobs whose document is `--document-kb` (its
   question's details carry it too), and as many with a one-line document, alternating, twice
   each way: each answered through the API (`POST /api/questions/{id}/answer/`, Django's test
   client in this process, a reviewer's token), one at a time. CPU and wall time per answer,
   medians.

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


def answers_timed(document_chars: int, count: int) -> dict[str, float]:
    """CPU and wall ms per answer of `count` paused `demo.review` jobs, each holding a document of
    `document_chars` characters, answered one at a time through the API."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from accounts.services import api_token_create
    from approvals.models import Question
    from jobs.runner import job_execute
    from jobs.services import job_submit

    reviewer = get_user_model().objects.filter(username="bench-reviewer").first()
    if reviewer is None:
        reviewer = get_user_model().objects.create_superuser("bench-reviewer", "bench@example.org", None)
    client = Client(HTTP_AUTHORIZATION=f"Token {api_token_create(user=reviewer, name='big json')[1]}")
    body = json.dumps({"answer": {"approved": True}})
    cpu, wall = [], []
    with mock.patch("jobs.services.transitions.job_dispatch"):
        ids = []
        for index in range(count):
            job, _ = job_submit(kind="demo.review", input={"document": f"{index} ".ljust(document_chars, "x")})
            job_execute(job_id=job.pk)  # it asks, and pauses
            ids.append(job.pk)
        questions = Question.objects.filter(job_id__in=ids, status="open").values_list("pk", flat=True)
        for question_id in questions:
            started_cpu, started = time.process_time(), time.perf_counter()
            response = client.post(f"/api/questions/{question_id}/answer/", body, content_type="application/json")
            cpu.append(time.process_time() - started_cpu)
            wall.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise SystemExit(f"big_json: the answer was refused: {response.status_code} {response.content[:300]!r}")
    if len(cpu) != count:
        raise SystemExit(f"big_json: {len(cpu)} of {count} review jobs paused on their question")
    return {"cpu_ms_per_answer": round(statistics.median(cpu) * 1000, 3),
            "wall_ms_per_answer": round(statistics.median(wall) * 1000, 3)}


def _wal_position() -> int | None:
    """Where PostgreSQL's write-ahead log is, in bytes (the whole server's: run this bench with
    nothing else writing), or None on another database."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _medians(sides: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {name: {key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]}
            for name, runs in sides.items()}


def measure(*, events: int, input_kb: int, steps: int, step_kb: int, answers: int = 0,
            document_kb: int = 90) -> dict[str, Any]:
    big = document(input_kb)
    sides: dict[str, list[dict[str, float]]] = {"empty input": [], f"{input_kb} kB input": []}
    for _ in range(2):
        sides["empty input"].append(events_timed({}, events))
        sides[f"{input_kb} kB input"].append(events_timed(big, events))
    answered: dict[str, list[dict[str, float]]] = {"a one-line document": [], f"a {document_kb} kB document": []}
    for _ in range(2 if answers else 0):
        answered["a one-line document"].append(answers_timed(20, answers))
        answered[f"a {document_kb} kB document"].append(answers_timed(document_kb * 1024, answers))
    return {**run_header(), "events": events, "input_bytes": len(json.dumps(big)),
            "events_per_input": _medians(sides),
            "step_kb": step_kb, "steps": steps_timed(steps, step_kb) if steps else [],
            "answers": answers, "answers_per_document": _medians(answered) if answers else {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=60, help="log lines a job appends, each way")
    parser.add_argument("--input-kb", type=int, default=850, help="the big input's size")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-kb", type=int, default=10, help="each step's result's size")
    parser.add_argument("--answers", type=int, default=40, help="review jobs answered a round, each way (0: none)")
    parser.add_argument("--document-kb", type=int, default=90,
                        help="the big document's size (demo.review takes up to 100,000 characters)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    result = measure(events=args.events, input_kb=args.input_kb, steps=args.steps, step_kb=args.step_kb,
                     answers=args.answers, document_kb=args.document_kb)
    print(f"{result['when']}, {result['revision']}, {result['machine']}")
    for name, figures in result["events_per_input"].items():
        print(f"  an event, {name}: {figures['cpu_ms_per_event']} ms CPU, {figures['wall_ms_per_event']} ms wall")
    for row in result["steps"]:
        wal = f", {row['wal_kb_per_step']} kB of WAL" if "wal_kb_per_step" in row else ""
        print(f"  steps {row['steps']} (checkpoint about {row['checkpoint_kb']} kB): {row['cpu_ms_per_step']} ms CPU, "
              f"{row['wall_ms_per_step']} ms wall{wal} per step")
    for name, figures in result["answers_per_document"].items():
        print(f"  an answer, {name}: {figures['cpu_ms_per_answer']} ms CPU, {figures['wall_ms_per_answer']} ms wall")
    if not args.no_write:
        print(f"written: {results_save('big-json', result['when'], result).relative_to(BASE_DIR)}")


if __name__ == "__main__":
    main()
