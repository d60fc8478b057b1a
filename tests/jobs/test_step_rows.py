"""A job's finished steps are rows of their own (`JobStep`): a step's write adds its row and leaves
the job's row as it was, a run reads its finished steps once, at its first step (a run without
steps reads none), and the migration carries the checkpoints stored before over to rows, and back."""

from __future__ import annotations

import json
import uuid
from unittest import mock

import psycopg
import pytest
from django.db import connection

from jobs.models import JSON_NULL, JobStep
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.chaos.servers import manage
from tests.support import processes
from tests.support.runs import claim, fresh

pytestmark = pytest.mark.django_db


def _row_bytes(job_id) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_column_size(j.*) FROM jobs_job j WHERE j.id = %s", [job_id])
        return cursor.fetchone()[0]


def test_a_steps_write_adds_its_row_and_leaves_the_jobs_row_its_size():
    """Before, every step wrote the job's whole checkpoint again (one JSON column: at 1.1 MB, 26-28
    ms and as much write-ahead log a step); now it writes its own row alone."""
    if connection.vendor != "postgresql":
        pytest.skip("the size of a row is PostgreSQL's to tell")
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
    ctx = claim(job.pk)
    result = {"rows": ["x" * 100] * 20}  # about 2 kB
    ctx.step("s0", lambda: result)
    size = _row_bytes(job.pk)
    for index in range(1, 20):
        assert ctx.step(f"s{index}", lambda: result) == result
    assert _row_bytes(job.pk) == size
    steps = list(JobStep.objects.filter(job=job).order_by("id").values_list("name", "attempt"))
    assert steps == [(f"s{index}", ctx.attempt) for index in range(20)]
    assert list(fresh(job).checkpoint) == [f"s{index}" for index in range(20)]


def test_a_run_without_steps_reads_no_steps():
    job, _ = job_submit(kind="demo.noop", input={})
    with mock.patch("jobs.runtime.steps_finished", side_effect=AssertionError("a run without steps read them")):
        assert job_execute(job_id=job.pk, worker="w", worker_hostname="w", task_id="t") == "completed"


def test_a_run_reads_its_finished_steps_once_at_its_first_step():
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
    ctx = claim(job.pk)
    JobStep.objects.create(job=job, name="one", result={"n": 1}, attempt=1)
    JobStep.objects.create(job=job, name="two", result=JSON_NULL, attempt=1)
    from jobs import runtime

    with mock.patch("jobs.runtime.steps_finished", wraps=runtime.steps_finished) as read:
        assert ctx.step("one", lambda: pytest.fail("a finished step ran again")) == {"n": 1}
        assert ctx.step("two", lambda: pytest.fail("a finished step ran again")) is None
        assert ctx.step("three", lambda: [3]) == [3]
        assert ctx.step("three", lambda: pytest.fail("a finished step ran again")) == [3]
    assert read.call_count == 1
    events = list(fresh(job).events.filter(type="step").order_by("seq").values_list("step", "status"))
    assert events == [("one", "skipped"), ("two", "skipped"), ("three", "started"), ("three", "completed"),
                      ("three", "skipped")]


@pytest.mark.parametrize("name", ["", "x" * 201, 7, None])
def test_a_steps_name_is_a_short_string_or_the_step_says_so(name):
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
    ctx = claim(job.pk)
    with pytest.raises(ValueError, match="a step's name must be a non-empty string of at most 200 characters"):
        ctx.step(name, lambda: pytest.fail("the step ran"))
    assert ctx.step("x" * 200, lambda: 1) == 1
    assert list(fresh(job).checkpoint) == ["x" * 200]


# -- the migration --------------------------------------------------------------------------------
BEFORE = ("jobs", "0006_followed")
CHECKPOINT = {"fetch": {"rows": [1, 2, 3]}, "nothing": None, "text": "é \u2603"}

_MAKE_JOBS = """
from django.db import connection
from django.db.migrations.loader import MigrationLoader
Job = MigrationLoader(connection).project_state(("jobs", "0006_followed")).apps.get_model("jobs", "Job")
Job.objects.create(kind="demo.sleep", checkpoint={checkpoint}, attempts=2)
Job.objects.create(kind="demo.noop")
print(Job.objects.count())
"""

_READ_STEPS = """
import json
from jobs.models import JobStep
print(json.dumps([[s.name, s.result, s.attempt, s.job.kind] for s in JobStep.objects.order_by("id")]))
"""

_READ_CHECKPOINTS = """
import json
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT kind, checkpoint FROM jobs_job ORDER BY kind")
    print(json.dumps([[kind, checkpoint if isinstance(checkpoint, dict) else json.loads(checkpoint)]
                      for kind, checkpoint in cursor.fetchall()]))
"""


@pytest.fixture
def scratch_database_url(tmp_path):
    """An empty database of this test's own, beside the tests' (PostgreSQL or SQLite)."""
    url = processes.test_database_url()
    if not url.startswith("postgres"):
        yield f"sqlite:///{tmp_path / 'migrations.sqlite3'}"
        return
    name = f"steps_migration_{uuid.uuid4().hex[:10]}"
    server = url.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_migration_moves_each_checkpoint_to_rows_and_back(scratch_database_url):
    env = processes.child_env(DATABASE_URL=scratch_database_url)
    manage("migrate", "--noinput", *BEFORE, env=env)
    made = manage("shell", "--verbosity", "0", "-c", _MAKE_JOBS.replace("{checkpoint}", repr(CHECKPOINT)), env=env)
    assert made.split() == ["2"]
    manage("migrate", "--noinput", env=env)
    steps = json.loads(manage("shell", "--verbosity", "0", "-c", _READ_STEPS, env=env))
    assert sorted(steps) == sorted([name, result, 2, "demo.sleep"] for name, result in CHECKPOINT.items())
    manage("migrate", "--noinput", *BEFORE, env=env)
    assert json.loads(manage("shell", "--verbosity", "0", "-c", _READ_CHECKPOINTS, env=env)) == [["demo.noop", {}],
                                                                             ["demo.sleep", CHECKPOINT]]


@pytest.mark.django_db(transaction=True)
def test_a_step_stored_meanwhile_by_another_transaction_wins_and_is_returned():
    """Another run's write of the same step, in a transaction still open when this step's
    statement starts: the statement waits for it, writes nothing, and cannot see its row (its
    snapshot is older); the step then reads the stored result again."""
    import threading

    from jobs.events import step_checkpoint

    if connection.vendor != "postgresql":
        pytest.skip("elsewhere the writers are serialised")
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
    ctx = claim(job.pk)
    returned: list = []
    with psycopg.connect(processes.test_database_url()) as other:
        other.execute("INSERT INTO jobs_jobstep (job_id, name, result, attempt) VALUES (%s, 'one', '\"theirs\"', 9)",
                      [job.pk])
        def write_mine() -> None:
            try:
                returned.append(step_checkpoint(job_id=job.pk, run_attempt=ctx.attempt, step="one", value="mine"))
            finally:
                connection.close()  # this thread's own

        mine = threading.Thread(target=write_mine)
        mine.start()
        mine.join(timeout=1)
        assert mine.is_alive(), "the step did not wait for the other transaction's row"
        other.commit()
    mine.join(timeout=10)
    assert returned == ["theirs"]
    assert fresh(job).checkpoint == {"one": "theirs"}
    assert fresh(job).events.filter(type="step", step="one", status="completed").count() == 1
