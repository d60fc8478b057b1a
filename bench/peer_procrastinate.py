"""A peer in the same run: Procrastinate, a job queue whose queue is a PostgreSQL table (no broker).

Issue 15 sets the platform's rate against bare Celery, and against Procrastinate's ratio to bare
Celery measured beside it. `bench/shipped.py` runs this phase between bare Celery and the floor:
- **the jobs**: N no-op jobs of one synchronous task (`peer.noop`), deferred as `manage.py submit
  --count` writes the platform's: 500 a transaction (`batch_defer`), from the bench's process;
- **the workers**: one Procrastinate worker process per pool process of the Celery workers beside
  it (`--concurrency`), each running one job at a time, as Procrastinate's documentation advises
  for synchronous tasks; they wake on PostgreSQL's LISTEN/NOTIFY (Procrastinate's default) and log
  at WARNING, as the bare workers do;
- **done**: when Procrastinate's own table says all N succeeded.

Procrastinate writes each job's row and its events in PostgreSQL, so a job survives a crash, as the
platform's and the floor's do; it has no broker and no live push.

The workers run as `python -m bench.peer_procrastinate workers N`: one parent (it does nothing
but wait) and N worker processes, so the bench's CPU budget reads them as one tree. The database
is the bench's own, made afresh for each run (`schema_apply`): Procrastinate's tables, functions
and triggers in a database of their own, never the platform's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import procrastinate

BASE_DIR = Path(__file__).resolve().parent.parent
QUEUE = "peer"
# The peer's database, set by the bench for its workers (a libpq connection string or URL).
DSN_ENV = "BENCH_PEER_DSN"

# The tables its jobs go through (the bench vacuums them before each round, as it does the others').
TABLES = ("procrastinate_jobs", "procrastinate_events")
# The bench's process defers the jobs: one line per batch at INFO is noise in the bench's output.
logging.getLogger("procrastinate").setLevel(logging.WARNING)

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="peer.noop", queue=QUEUE)
def noop() -> None:
    """The no-op job: nothing, as `demo.noop` and bare Celery's task (which adds one to a counter)."""


@contextlib.contextmanager
def opened(dsn: str) -> Iterator[procrastinate.App]:
    """The app open on `dsn`'s database, in the bench's own process (the workers read `DSN_ENV`)."""
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=dsn)), app.open():
        yield app


def schema_apply(dsn: str) -> None:
    """Procrastinate's schema in `dsn`'s database, which must be empty (the bench makes it afresh)."""
    with opened(dsn):
        app.schema_manager.apply_schema()


def submit(dsn: str, count: int, batch: int = 500) -> list[int]:
    """`count` no-op jobs, `batch` to a transaction; their ids."""
    ids: list[int] = []
    with opened(dsn):
        for start in range(0, count, batch):
            ids += noop.batch_defer(*[{}] * min(batch, count - start))
    return ids


def succeeded(conn: Any) -> int:
    """How many jobs Procrastinate has recorded as succeeded (`conn`: a psycopg connection)."""
    return conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()[0]


def drain_span(conn: Any, ids: list[int]) -> tuple[Any, Any]:
    """When the first of `ids` started and the last succeeded, from Procrastinate's events."""
    return conn.execute(
        "SELECT min(at) FILTER (WHERE type = 'started'), max(at) FILTER (WHERE type = 'succeeded') "
        "FROM procrastinate_events WHERE job_id = ANY(%s)", [ids]).fetchone()


def workers(count: int) -> int:
    """Start `count` worker processes and wait for them; SIGTERM or SIGINT stops them all."""
    children = [subprocess.Popen([sys.executable, "-m", "bench.peer_procrastinate", "worker"], cwd=BASE_DIR)
                for _ in range(count)]

    def stop(signum: int, _frame: object) -> None:
        for child in children:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return max(child.wait() for child in children)


def worker() -> None:
    """One worker process, one job at a time, on the bench's queue (SIGTERM: a graceful stop)."""
    app.run_worker(queues=[QUEUE], concurrency=1, wait=True, install_signal_handlers=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        worker()
        return 0
    if len(argv) == 2 and argv[0] == "workers" and argv[1].isdigit() and int(argv[1]) > 0:
        return workers(int(argv[1]))
    print("usage: python -m bench.peer_procrastinate workers N | worker", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
