"""Fan-out bench: what a parent of many children costs, with `demo.batch_review`.

    python bench/fanout.py [--documents 500] [--concurrency 2]

It starts one Celery worker, as a deployment does, submits one `demo.batch_review` of
`--documents` documents (one `demo.review` child each, the contract's maximum is 500), answers
every child's question as a reviewer would (through `question_answer`, approving the even ones),
and measures from the job's events:

- spawn: the parent's first run, from `processing` to `waiting` (the worker it holds while it
  creates and dispatches its children; it holds none after that);
- children: from the parent's park to the end of its last child;
- wake: from the last child's end to the parent running again (the resume latency);
- replay: the parent's second run, from `processing` to `completed` (it finds its children);
- how many times the parent was resumed (exactly once is the aim).

Uses DATABASE_URL and REDIS_URL when set (else the embedded Redis and var/bench.sqlite3), and a
Redis key prefix of its own. Writes bench/results/fanout-<UTC timestamp>.json and fanout-latest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import RESULTS_DIR, prepare_environment  # noqa: E402
from bench.wake import VENV_BIN, start, stop, wait_for  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=500, help="children of the batch (1..500)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    setup = prepare_environment()
    (BASE_DIR / "var").mkdir(exist_ok=True)

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from approvals.models import Question
    from approvals.services import question_answer
    from jobs.models import Job, JobEvent
    from jobs.services import job_submit

    call_command("migrate", verbosity=0)
    users = get_user_model()
    reviewer = users.objects.filter(username="bench-reviewer").first() or users.objects.create_user(
        username="bench-reviewer", is_staff=True, is_superuser=True)
    worker = start("fanout-worker", [str(VENV_BIN / "celery"), "-A", "taskplatform", "worker", "--loglevel",
                                     "WARNING", "--concurrency", str(args.concurrency), "--without-mingle",
                                     "--without-gossip"])
    try:
        started = time.monotonic()
        parent, _ = job_submit(kind="demo.batch_review",
                               input={"documents": [f"document {n}" for n in range(args.documents)]})
        answered = 0
        while answered < args.documents:
            wait_for(lambda: Question.objects.filter(job__parent=parent, status="open").exists(), 600,
                     f"questions (after {answered})")
            for question in Question.objects.filter(job__parent=parent, status="open").select_related("job"):
                index = int(question.job.spawn_key.rsplit(".", 1)[1])
                answer = {"approved": True} if index % 2 == 0 else {"approved": False, "reason": "odd"}
                question_answer(question_id=question.pk, user=reviewer, answer=answer, channel="api")
                answered += 1
        wait_for(lambda: Job.objects.get(pk=parent.pk).is_finished, 600, "the parent")
        total = time.monotonic() - started
    finally:
        stop(worker)

    parent = Job.objects.get(pk=parent.pk)
    events = list(JobEvent.objects.filter(job=parent, type="status").order_by("seq"))
    statuses = [event.status for event in events]
    at = {}
    for event in events:
        at.setdefault(event.status, []).append(event.created_at)
    last_child = Job.objects.filter(parent=parent).order_by("-finished_at").values_list("finished_at", flat=True)[0]
    resumed_at = [event.created_at for event in events if event.status == "processing"][1]
    result = {
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "database": os.environ["DATABASE_URL"].split(":", 1)[0], **setup,
        "documents": args.documents, "concurrency": args.concurrency, "status": parent.status,
        "resumes": statuses.count("waiting"),
        "spawn_s": round((at["waiting"][0] - at["processing"][0]).total_seconds(), 3),
        "children_s": round((last_child - at["waiting"][0]).total_seconds(), 3),
        "wake_ms": round((resumed_at - last_child).total_seconds() * 1000, 1),
        "replay_s": round((at["completed"][0] - resumed_at).total_seconds(), 3),
        "total_s": round(total, 2),
        "approved": len(parent.result["approved"]) if parent.result else None,
    }
    table = (
        "| children | spawn s | children s | wake ms | replay s | resumes | total s |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {args.documents} | {result['spawn_s']} | {result['children_s']} | {result['wake_ms']} | "
        f"{result['replay_s']} | {result['resumes']} | {result['total_s']} |\n\n"
        f"`demo.batch_review` of {args.documents} documents, every question answered by the bench; "
        f"{result['database']}, {setup['redis_kind']} Redis, worker concurrency {args.concurrency}; "
        f"the parent ended {parent.status}.\n"
    )
    print(table)
    if not args.no_write:
        RESULTS_DIR.mkdir(exist_ok=True)
        (RESULTS_DIR / f"fanout-{result['when']}.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS_DIR / "fanout-latest.md").write_text(f"# Fan-out bench, {result['when']}\n\n{table}")


if __name__ == "__main__":
    main()
