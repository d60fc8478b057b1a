"""The substrate's floor for a durable job: bare Celery plus the platform's own SQL, no Django.

`bench/shipped.py` measures it beside bare Celery and the platform, in the same run. Each task
runs the two statements the platform's worker runs for a no-op job (the claim and the outcome,
each an UPDATE with its event's INSERT in one statement), taken verbatim from the platform at the
start of the run (`capture_statements`), on copies of the platform's tables (`jobs_job` and
`jobs_jobevent`, with their indexes and the event's foreign key). The jobs are submitted the way
`manage.py submit --count` does it: a transaction per 500 with the jobs' rows and their first
events, then one message each. The worker has bare Celery's settings (late acks, prefetch 1) and,
as the platform ships since 2026-12-05, no acknowledgement emulation (bench/shipped.py sets
BARE_ACK_EMULATION=off for it).

So the gap between bare Celery and this is what Celery + PostgreSQL + Redis cost for a job that
survives a crash; the gap between this and the platform is the platform's own code.
"""

from __future__ import annotations

import json
import os
import uuid
from functools import cache
from typing import Any
from unittest import mock

from celery import Celery

from bench.bare_celery import refuse_django, transport_options

JOBS = "bench_durable_job"
EVENTS = "bench_durable_event"
# A pending `demo.noop` job's row and first event as `manage.py submit` writes them: the columns,
# and the values after the job's id, kind, status and input (and after the event's job id).
JOB_COLUMNS = ("id, kind, status, input, progress_fraction, progress_text, attempts, max_attempts, hand_backs, "
               "event_seq, suspended_on, feature_rows, worker, task_id, spawn_key, gathering, created_at")
JOB_PENDING_REST = "0.0, '', 0, 3, 0, 1, '', false, '', '', NULL, NULL, now()"
EVENT_COLUMNS = "job_id, seq, type, step, status, message, created_at"
EVENT_FIRST = "1, 'status', '', 'pending', '{}'::jsonb"
# Set by the bench for the worker: the JSON file that `capture_statements` wrote.
STATEMENTS_ENV = "BENCH_DURABLE_STATEMENTS"

app = Celery("durable", broker=os.environ.get("BARE_CELERY_BROKER", "redis://127.0.0.1:6379/0"), set_as_current=False)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_serializer="json",
                accept_content=["json"], task_ignore_result=True, worker_hijack_root_logger=False,
                broker_transport_options=transport_options())
refuse_django(app)


def capture_statements(job_kind: str = "demo.noop", jobs_table: str = JOBS,
                       events_table: str = EVENTS) -> dict[str, str]:
    """Run one `job_kind` job through the platform's own runner, in this (Django) process, and
    return the statements it sent for the run, as templates over the bench's tables (or the two
    named): the job's id, the worker, the task id and the event's time become parameters."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.runner import job_execute
    from jobs.services import jobs_submit_many

    with mock.patch("jobs.services.transitions.jobs_dispatch"):  # run here, not by the platform's worker
        job = jobs_submit_many(kind=job_kind, inputs=[{}])[0]
    worker, task = "bench-capture pid 0", f"bench-capture-{uuid.uuid4().hex}"
    with CaptureQueriesContext(connection) as captured:
        job_execute(job_id=str(job.id), worker=worker, worker_hostname="bench-capture", task_id=task)
    statements = [q["sql"] for q in captured.captured_queries]
    if len(statements) != 2 or not all(s.startswith("WITH j AS (UPDATE") for s in statements):
        raise SystemExit(f"bench: a no-op run sent {len(statements)} statements, not the claim and the outcome: "
                         f"{statements}")

    def template(sql: str) -> str:
        sql = sql.replace("%", "%%").replace(f"'{job.id.hex}'::uuid", "%(id)s::uuid")
        sql = sql.replace(f"'{worker}'", "%(worker)s").replace(f"'{task}'", "%(task)s")
        # The event's time, a literal taken as the statement was built.
        head, sep, tail = sql.rpartition("'::timestamptz FROM j")
        if not sep:
            raise SystemExit(f"bench: no event time in {sql}")
        sql = head[: head.rindex("'")] + "%(now)s::timestamptz FROM j" + tail
        return sql.replace('"jobs_jobevent"', f'"{events_table}"').replace('"jobs_job"', f'"{jobs_table}"')

    claim, outcome = (template(s) for s in statements)
    return {"claim": claim, "outcome": outcome}


def create_tables(conn: Any) -> None:
    """Copies of the platform's two tables (columns, defaults, checks, indexes; the event's
    foreign key to its job), empty."""
    conn.execute(f"DROP TABLE IF EXISTS {EVENTS}, {JOBS}")
    conn.execute(f"CREATE TABLE {JOBS} (LIKE jobs_job INCLUDING ALL)")
    conn.execute(f"CREATE TABLE {EVENTS} (LIKE jobs_jobevent INCLUDING ALL)")
    conn.execute(f"ALTER TABLE {EVENTS} ADD FOREIGN KEY (job_id) REFERENCES {JOBS} (id) DEFERRABLE INITIALLY DEFERRED")


def submit(conn: Any, count: int, batch: int = 500) -> list[str]:
    """`count` pending jobs as `manage.py submit` writes them (a transaction per `batch`: the
    jobs' rows, then their first events), each dispatched once its batch committed."""
    ids: list[str] = []
    with app.producer_or_acquire() as producer:
        for start in range(0, count, batch):
            chunk = [uuid.uuid4() for _ in range(min(batch, count - start))]
            insert_pending(conn, chunk)
            for job_id in chunk:
                run.apply_async(args=[str(job_id)], queue="durable", producer=producer)
                ids.append(str(job_id))
    return ids


def insert_pending(conn: Any, ids: list[uuid.UUID]) -> None:
    """The pending jobs `ids`, their rows and first events, in one transaction (no message)."""
    with conn.transaction():
        conn.execute(
            f"INSERT INTO {JOBS} ({JOB_COLUMNS}) SELECT id, 'demo.noop', 'pending', '{{}}'::jsonb, "
            f"{JOB_PENDING_REST} FROM UNNEST(%s::uuid[]) AS t(id)",
            [ids])
        conn.execute(
            f"INSERT INTO {EVENTS} ({EVENT_COLUMNS}) SELECT id, {EVENT_FIRST}, now() "
            "FROM UNNEST(%s::uuid[]) AS t(id)",
            [ids])


@cache
def _statements() -> dict[str, str]:
    with open(os.environ[STATEMENTS_ENV]) as file:
        return json.load(file)


@cache
def _cursor() -> Any:
    """One connection per worker process, autocommit, one round trip per statement, sent as the
    platform sends them: prepared once per connection (`dbkit.prepared`), unless the bench's
    environment sets DATABASE_PREPARED_STATEMENTS=false (then client-side binding, the literals
    inline, as Django's psycopg backend sends any other statement)."""
    import psycopg

    prepared = os.environ.get("DATABASE_PREPARED_STATEMENTS", "true").strip().lower() not in {"0", "false", "no", "off"}
    factory = psycopg.Cursor if prepared else psycopg.ClientCursor
    conn = psycopg.connect(os.environ["BENCH_DURABLE_DSN"], autocommit=True, cursor_factory=factory,
                           prepare_threshold=0 if prepared else None)
    return conn.cursor()


@app.task(name="durable.run")
def run(job_id: str) -> None:
    from datetime import UTC, datetime

    statements, cursor = _statements(), _cursor()
    params = {"id": job_id, "worker": f"durable pid {os.getpid()}", "task": run.request.id or "",
              "now": datetime.now(UTC)}
    if cursor.execute(statements["claim"], params).fetchone() is None:
        return  # taken already: a duplicate delivery
    params["now"] = datetime.now(UTC)
    cursor.execute(statements["outcome"], params).fetchone()
