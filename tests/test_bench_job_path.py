"""bench/job_path.py at a small size: both sides run every job they make, on the real
PostgreSQL and Redis, and the bench's tables go at the end."""

from __future__ import annotations

import pytest
from django.db import connection
from psycopg.conninfo import make_conninfo

from jobs.models import Job

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the floor's statements are PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


def _dsn() -> str:
    params = connection.get_connection_params()
    return make_conninfo("", **{key: params[key] for key in ("dbname", "host", "port", "user", "password")
                                if params.get(key) not in (None, "")})


def test_the_job_path_bench_times_both_sides_and_counts_their_calls():
    from bench import bare_durable, job_path

    result = job_path.measure(count=12, rounds=2, dsn=_dsn())
    assert [row["round"] for row in result["rounds"]] == [1, 2]
    for row in result["rounds"]:
        for side in ("platform", "floor"):
            assert row[side]["cpu_ms_per_job"] > 0 and row[side]["wall_ms_per_job"] > 0
    server = result["median_postgres_cpu_ms_per_job"]
    assert all(value >= 0 for value in server.values())
    if connection.settings_dict.get("HOST") in ("127.0.0.1", "localhost", "::1"):  # each side's backend was read
        assert set(server) == {"platform", "floor"}
    calls = result["python_calls_per_job"]
    assert calls["platform"] > calls["floor"] > 0
    # Every job the platform's side made ran to its end: the one whose statements the floor takes, the
    # warm-up's, both rounds', the counted pass's; then the moves taken apart: the one whose statements
    # the straight sides send, the one whose statements the floor's side takes, and each of the four
    # sides' warm-up and rounds.
    apart_jobs = 2 + len(job_path.MOVE_SIDES) * (job_path.WARMUP + 2 * 12)
    assert Job.objects.filter(status=Job.Status.COMPLETED).count() == 1 + job_path.WARMUP + 2 * 12 + 12 + apart_jobs
    assert not Job.objects.exclude(status=Job.Status.COMPLETED).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s), to_regclass(%s)", [bare_durable.JOBS, bare_durable.EVENTS])
        assert cursor.fetchone() == (None, None)
    apart = result["moves_apart"]
    assert [row["round"] for row in apart["rounds"]] == [1, 2]
    assert all(row[side] > 0 for row in apart["rounds"] for side in job_path.MOVE_SIDES)
    assert apart["median_over_floor"][job_path.MOVE_SIDES[-1]] == 1
    around = result["around_tasks"]
    assert [row["round"] for row in around["rounds"]] == [1, 2]
    assert all(row[side] > 0 for row in around["rounds"] for side in job_path.AROUND_SIDES)
    from celery import signals  # the bench leaves no receiver and no task of its own behind

    assert not signals.task_prerun.receivers and not signals.task_postrun.receivers
    from taskplatform.celery import app

    assert "bench.around_bare" not in app.tasks and "run" not in vars(app.tasks["jobs.run"])
    assert "| median |" in job_path.markdown({**result, "when": "now", "revision": "r", "machine": "m", "count": 12})
