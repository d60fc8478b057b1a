"""The job services: submit, the status machine, events, idempotency (no worker: the runner is
called in-process, and on_commit callbacks are captured where a dispatch matters)."""

import re
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from jobs.errors import IdempotencyConflict, InvalidInput, InvalidTransition, JobNotFound, UnknownKind
from jobs.models import Job
from jobs.services import job_cancel, job_claim, job_retry, job_submit, job_transition
from tests.support.commit import dispatches

pytestmark = pytest.mark.django_db

S = Job.Status


def seqs(job):
    return list(job.events.order_by("seq").values_list("seq", flat=True))


def test_submit_creates_a_pending_job_with_its_first_event(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        job, created = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 2})
    assert created and job.status == S.PENDING and job.attempts == 0 and job.max_attempts == 3
    assert [(e.seq, e.type, e.status) for e in job.events.all()] == [(1, "status", "pending")]
    assert len(dispatches(callbacks)) == 1  # the dispatch, scheduled after the commit


def test_submit_refuses_an_unknown_kind_naming_the_known_ones():
    with pytest.raises(UnknownKind, match="known kinds: .*demo.noop"):
        job_submit(kind="demo.nope", input={})


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"seconds": 1}, "input"),  # missing steps
        ({"seconds": 5000, "steps": 1}, "input.seconds"),
        ({"seconds": 1, "steps": "two"}, "input.steps"),
        ({"seconds": 1, "steps": 1, "extra": True}, "input"),
    ],
)
def test_submit_validates_input_against_the_kind_schema(payload, field):
    with pytest.raises(InvalidInput) as info:
        job_submit(kind="demo.sleep", input=payload)
    assert info.value.field == field
    assert info.value.message.startswith(field)
    assert Job.objects.count() == 0


def test_idempotency_key_returns_the_same_job_and_refuses_another_body(submitter):
    first, created = job_submit(kind="demo.review", input={"document": "a"}, owner=submitter, idempotency_key="k1")
    again, created_again = job_submit(kind="demo.review", input={"document": "a"}, owner=submitter,
                                      idempotency_key="k1")
    assert created and not created_again and again.pk == first.pk
    with pytest.raises(IdempotencyConflict, match="k1"):
        job_submit(kind="demo.review", input={"document": "b"}, owner=submitter, idempotency_key="k1")
    # Scoped to the caller: another owner may use the same key.
    other, created_other = job_submit(kind="demo.review", input={"document": "a"}, idempotency_key="k1")
    assert created_other and other.pk != first.pk


def test_claim_is_won_once():
    job, _ = job_submit(kind="demo.noop", input={})
    claimed = job_claim(job_id=job.pk)
    assert claimed.status == S.PROCESSING and claimed.attempts == 1 and claimed.started_at
    with pytest.raises(InvalidTransition, match="is processing"):
        job_claim(job_id=job.pk)
    assert Job.objects.get(pk=job.pk).attempts == 1


def test_illegal_moves_are_refused_and_change_nothing():
    job, _ = job_submit(kind="demo.noop", input={})
    with pytest.raises(InvalidTransition, match="is pending; it cannot move to completed"):
        job_transition(job_id=job.pk, to=S.COMPLETED)
    job.refresh_from_db()
    assert job.status == S.PENDING and seqs(job) == [1]
    with pytest.raises(JobNotFound):
        job_transition(job_id="00000000-0000-0000-0000-000000000000", to=S.PROCESSING)


def test_every_move_in_the_table_is_allowed_and_nothing_else():
    for source, targets in Job.TRANSITIONS.items():
        for target in S.values:
            job = Job.objects.create(kind="demo.noop", status=source)
            if target in targets:
                moved = job_transition(job_id=job.pk, to=target)
                assert moved.status == target
                assert moved.events.get(seq=1).status == target
            else:
                with pytest.raises(InvalidTransition):
                    job_transition(job_id=job.pk, to=target)


def test_terminal_statuses_set_finished_at_and_completed_is_final():
    job, _ = job_submit(kind="demo.noop", input={})
    job_claim(job_id=job.pk)
    done = job_transition(job_id=job.pk, to=S.COMPLETED)
    assert done.finished_at is not None
    for target in S.values:
        with pytest.raises(InvalidTransition):
            job_transition(job_id=job.pk, to=target)


def test_cancel_then_retry(django_capture_on_commit_callbacks):
    job, _ = job_submit(kind="demo.noop", input={})
    cancelled = job_cancel(job_id=job.pk)
    assert cancelled.status == S.CANCELLED
    with pytest.raises(InvalidTransition):
        job_cancel(job_id=job.pk)
    with django_capture_on_commit_callbacks() as callbacks:
        retried = job_retry(job_id=job.pk)
    assert retried.status == S.PENDING and retried.max_attempts == retried.attempts + 3 and retried.finished_at is None
    assert len(dispatches(callbacks)) == 1
    assert [e.status for e in retried.events.order_by("seq")] == ["pending", "cancelled", "pending"]


def test_only_job_transition_writes_the_status_column():
    """House rule: one function changes Job.status. Look for any other writer in the code."""
    root = Path(__file__).resolve().parents[2]
    # Tracked and new (untracked, not ignored) files, as the working tree has them now.
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=root,
                           capture_output=True, text=True).stdout.split()
    writers = re.compile(
        r"(\bjob\.status\s*=(?!=)"  # attribute assignment
        r"|\.update(_returning)?\([^)]*\bstatus="  # queryset updates
        r"|Job\.objects\.(create|bulk_create)\([^)]*\bstatus="
        r"|\"status\":\s*to\b)"  # the values job_transition writes
    )
    offenders = []
    for name in files:
        if name.startswith(("tests/", "bench/")) or "/migrations/" in name or not (root / name).exists():
            continue
        for number, line in enumerate((root / name).read_text().splitlines(), 1):
            if writers.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    allowed = {"jobs/services/transitions.py"}
    assert [o for o in offenders if o.split(":")[0] not in allowed] == []
    # ...and in jobs/services/transitions.py only job_transition builds the status value.
    assert [o for o in offenders if o.startswith("jobs/services/transitions.py")] != []


def test_submit_many_creates_every_job_with_its_first_event_and_dispatches_after_commit(
    django_capture_on_commit_callbacks, submitter
):
    with django_capture_on_commit_callbacks() as callbacks:
        from jobs.services import jobs_submit_many

        jobs = jobs_submit_many(kind="demo.sleep", inputs=[{"seconds": 0, "steps": n} for n in (1, 2, 3)],
                                owner=submitter)
    assert [job.input["steps"] for job in jobs] == [1, 2, 3]
    for job in Job.objects.filter(pk__in=[job.pk for job in jobs]):
        assert job.status == S.PENDING and job.owner == submitter and job.event_seq == 1 and job.max_attempts == 3
        assert [(e.seq, e.type, e.status) for e in job.events.all()] == [(1, "status", "pending")]
    [send_all] = dispatches(callbacks)  # one callback sends the batch, each job on its own
    with mock.patch("jobs.services.transitions.job_dispatch") as dispatch:
        send_all()
    assert [call.kwargs["job"].pk for call in dispatch.call_args_list] == [job.pk for job in jobs]


def test_submit_many_writes_its_jobs_and_their_first_events_in_one_statement(submitter):
    """On PostgreSQL: the jobs as one UNNEST of an array per column (Django's form for many rows,
    which `updated_at`'s DEFAULT in every row used to rule out: a placeholder per value, two
    fifths of a batch's CPU), their first events in the same statement, and each job's database
    default and event read back."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.services import jobs_submit_many

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's one-statement batch")
    with CaptureQueriesContext(connection) as batch:
        jobs = jobs_submit_many(kind="demo.sleep", inputs=[{"seconds": 0, "steps": n} for n in range(1, 51)],
                                owner=submitter)
    inserts = [query["sql"] for query in batch.captured_queries if "INSERT" in query["sql"]]
    assert len(inserts) == 1, inserts
    assert "UNNEST(" in inserts[0] and '"jobs_jobevent"' in inserts[0], inserts[0][:300]
    assert "VALUES" not in inserts[0], "a placeholder per value"
    stored = {job.pk: job for job in Job.objects.filter(pk__in=[job.pk for job in jobs])}
    for job in jobs:
        assert not job._state.adding and job.updated_at == stored[job.pk].updated_at is not None
        assert stored[job.pk].input == job.input and stored[job.pk].owner == submitter
        assert [(e.seq, e.type, e.status) for e in stored[job.pk].events.all()] == [(1, "status", "pending")]


def test_submit_many_is_all_or_nothing_and_names_the_bad_input():
    from jobs.services import jobs_submit_many

    with pytest.raises(InvalidInput) as info:
        jobs_submit_many(kind="demo.sleep", inputs=[{"seconds": 0, "steps": 1}, {"seconds": 0, "steps": "x"}])
    assert info.value.field == "inputs[1].steps" and info.value.message.startswith("inputs[1].steps:")
    assert Job.objects.count() == 0


def test_the_submit_command_runs_no_system_checks(monkeypatch, capsys):
    """From the command line (`call_command` would skip them anyway): the checks load every
    URLconf before the first job, a quarter of a second per submit."""
    from django.core.management import base

    from jobs.management.commands.submit import Command

    def refuse(*args, **kwargs):
        raise AssertionError("submit ran Django's system checks")

    monkeypatch.setattr(base.BaseCommand, "check", refuse)
    monkeypatch.setattr(base.connections, "close_all", lambda: None)  # the test's transaction stays open
    Command().run_from_argv(["manage.py", "submit", "demo.noop"])
    (job_id,) = capsys.readouterr().out.split()
    assert Job.objects.filter(pk=job_id).exists()


def test_the_submit_command_prints_one_id_per_job(capsys):
    from django.core.management import CommandError, call_command

    call_command("submit", "demo.noop", "--count", "3")
    ids = capsys.readouterr().out.split()
    assert len(ids) == 3 and Job.objects.filter(pk__in=ids, kind="demo.noop").count() == 3
    with pytest.raises(CommandError, match="inputs\\[0\\]"):
        call_command("submit", "demo.sleep", "--input", '{"seconds": 1}')


@pytest.mark.django_db(transaction=True)  # each batch really commits, and is dispatched then
def test_the_submit_command_dispatches_a_small_first_batch_before_writing_the_rest(capsys, monkeypatch):
    """`--count N` writes and dispatches its first few jobs on their own (50), so the workers start
    on them while the rest are written, in larger transactions (500; smaller here)."""
    from django.core.management import call_command

    from jobs.management.commands import submit
    from jobs.services import jobs_submit_many

    written: list[int] = []
    dispatched: list[int] = []

    def counted(*, kind, inputs, **kwargs):
        written.append(len(inputs))
        assert sum(dispatched) == sum(written[:-1]), "a batch was written before the one before it was dispatched"
        return jobs_submit_many(kind=kind, inputs=inputs, **kwargs)

    monkeypatch.setattr(submit, "jobs_submit_many", counted)
    monkeypatch.setattr(submit.Command, "first_batch", 2)
    monkeypatch.setattr(submit.Command, "batch", 5)
    monkeypatch.setattr("jobs.services.transitions.jobs_dispatch",
                        lambda jobs, **kwargs: dispatched.append(len(list(jobs))))
    call_command("submit", "demo.noop", "--count", "13")
    assert written == [2, 5, 5, 1] and dispatched == [2, 5, 5, 1]
    assert len(capsys.readouterr().out.split()) == 13 == Job.objects.filter(kind="demo.noop").count()
