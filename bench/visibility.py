"""What a reviewer's reads cost as the database grows: one question, one job, one wait, a page of
jobs, the inbox's count, read as a reviewer who is not staff (an API client's reviewer, made by
`create_api_token --reviewer`: staff see every row without these checks).

    DATABASE_URL=postgres://…/bench_visibility REDIS_URL=redis://… python bench/visibility.py [--sizes 1000,10000]

For each size N, on a database it makes afresh (dropped and created: give it one of its own), it
writes N `demo.review` jobs paused on their question (assigned to the group `reviewers`, as the
demo asks) and N jobs that asked nothing, one wait, and takes the tables' statistics (as
autovacuum would). Then it times each read (`--repeat` times, the median), in one process,
with PostgreSQL's JIT compilation off (as the platform's connections have it) and on (the
server's default). Writes bench/results/visibility-<UTC timestamp>.json and visibility-latest.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:  # run as a script
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import results_save, run_header  # noqa: E402

READS = ("one question", "one job", "one wait", "a page of 50 jobs", "the inbox's count")


def populate(size: int) -> tuple[Any, Any, Any, Any]:
    """(the reviewer, a question, its job, a wait of that job) among `size` paused reviews and
    `size` jobs that asked nothing. The first review runs for real; the rest are copies of it."""
    from django.contrib.auth.models import Group
    from django.db import connection

    from accounts.services import user_ensure
    from approvals.models import Question
    from jobs.models import Job
    from jobs.runner import job_execute
    from jobs.services import job_submit
    from waits.models import Wait

    reviewer, _ = user_ensure(username="bench-api-reviewer", reviewer=True)
    assert not reviewer.is_staff and reviewer.groups.filter(name="reviewers").exists()
    with mock.patch("jobs.services.transitions.job_dispatch"):
        job, _ = job_submit(kind="demo.review", input={"document": "bench"})
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    question = Question.objects.get(job=job)

    def fields(row: Any) -> dict[str, Any]:
        return {field.attname: getattr(row, field.attname) for field in row._meta.concrete_fields}

    groups = list(Group.objects.filter(name="reviewers").values_list("pk", flat=True))
    through = Question.assigned_groups.through
    for start in range(0, size, 5000):
        batch = min(5000, size - start)
        jobs = [Job(**{**fields(job), "id": uuid.uuid4()}) for _ in range(batch)]
        Job.objects.bulk_create(jobs)
        questions = [Question(**{**fields(question), "id": uuid.uuid4(), "job_id": each.pk}) for each in jobs]
        Question.objects.bulk_create(questions)
        through.objects.bulk_create([through(question_id=each.pk, group_id=group) for each in questions
                                     for group in groups])
        Job.objects.bulk_create([Job(**{**fields(job), "id": uuid.uuid4(), "status": Job.Status.COMPLETED})
                                 for _ in range(batch)])
    wait = Wait.objects.create(job=job, key="render", token_salt=secrets.token_hex(8),
                               token_hash=secrets.token_hex(32))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return reviewer, question, job, wait


def reads(reviewer: Any, question: Any, job: Any, wait: Any) -> dict[str, Callable[[], Any]]:
    from approvals.selectors import question_get_visible, questions_waiting_count
    from jobs.selectors import job_get_visible, jobs_visible_to
    from waits.selectors import wait_get_visible

    return {
        "one question": lambda: question_get_visible(user=reviewer, question_id=question.pk),
        "one job": lambda: job_get_visible(user=reviewer, job_id=job.pk),
        "one wait": lambda: wait_get_visible(user=reviewer, wait_id=wait.pk),
        "a page of 50 jobs": lambda: list(jobs_visible_to(reviewer).order_by("-created_at")[:50]),
        "the inbox's count": lambda: questions_waiting_count(reviewer),
    }


def timed(read: Callable[[], Any], repeat: int) -> float:
    read()  # the statement built and prepared once
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        read()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def measure(size: int, repeat: int) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connection

    from bench.shipped import database_recreate

    connection.close()
    database_recreate(os.environ["DATABASE_URL"])
    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    rows = populate(size)
    print(f"{size:,} reviews and {size:,} other jobs written in {time.perf_counter() - started:.1f} s", flush=True)
    result: dict[str, Any] = {"size": size}
    for jit in ("off", "on"):
        with connection.cursor() as cursor:
            cursor.execute(f"SET jit = {jit}")
        result[f"jit_{jit}_ms"] = {name: timed(read, repeat) for name, read in reads(*rows).items()}
        print(f"  jit {jit}: " + ", ".join(f"{name} {ms} ms" for name, ms in result[f"jit_{jit}_ms"].items()),
              flush=True)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# A reviewer's reads as the database grows ({result['when']}, code {result['revision']})", "",
             f"{result['machine']}; a reviewer who is not staff; N paused reviews (one question each, assigned to "
             f"`reviewers`) and N jobs that asked nothing; the median of {result['repeat']} reads, ms; "
             "`bench/visibility.py`.", "",
             "| N | JIT | " + " | ".join(READS) + " |", "|---:|---|" + "---:|" * len(READS)]
    for row in result["sizes"]:
        for jit in ("off", "on"):
            times = row[f"jit_{jit}_ms"]
            lines.append(f"| {row['size']:,} | {jit} | " + " | ".join(str(times[name]) for name in READS) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,30000", help="reviews (and as many other jobs), comma-separated")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"bench: --sizes must be whole numbers separated by commas, got {args.sizes!r}") from None
    if any(size < 1 for size in sizes) or args.repeat < 1:
        raise SystemExit("bench: each of --sizes and --repeat must be at least 1")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        raise SystemExit("bench: set DATABASE_URL (PostgreSQL; the database is dropped and made again) and REDIS_URL")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.development")
    import django

    django.setup()
    measured = [measure(size, args.repeat) for size in sizes]
    result = {**run_header(), "repeat": args.repeat, "sizes": measured}
    text = markdown(result)
    print(text)
    if not args.no_write:
        results_save("visibility", result["when"], result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
