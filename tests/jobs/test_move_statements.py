"""The kept move statements (jobs/statements.py): built by the ORM once per shape, then reused
with each move's own values. The test settings compare every reuse with the ORM's statement
(`JOBS_CHECK_MOVE_STATEMENTS`), so the whole suite checks them; these tests check that the
reuse happens, that the comparison catches a wrong statement, and what is never kept."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from django.db import connection
from django.db.models import F, Func, IntegerField
from django.test.utils import CaptureQueriesContext

from jobs import statements
from jobs.models import Job
from jobs.services import job_claim, job_complete
from jobs.services.submitting import job_submit
from jobs.services.transitions import job_transition
from jobs.statements import MoveRows, move_statement
from tests.support.statements import count_builds

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(statements, "_kept", {})


def _pending(count: int, monkeypatch) -> list[Job]:
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    return [job_submit(kind="demo.noop", input={})[0] for _ in range(count)]


def test_a_second_move_of_the_same_shape_reuses_the_statement_with_its_own_values(monkeypatch):
    first, second = _pending(2, monkeypatch)
    built = count_builds(monkeypatch)

    with CaptureQueriesContext(connection) as one:
        job_claim(job_id=first.pk, worker="w1 pid 1", task_id="t-1")
    with CaptureQueriesContext(connection) as two:
        claimed = job_claim(job_id=second.pk, worker="w2 pid 2", task_id="t-2")

    assert len(built) == 1, "the second claim was built by the ORM again"
    assert (claimed.worker, claimed.task_id, claimed.attempts, claimed.status) == ("w2 pid 2", "t-2", 1, "processing")
    first.refresh_from_db()
    assert (first.worker, first.task_id, first.status) == ("w1 pid 1", "t-1", "processing")
    # The same text, each with its own job's id and values (elsewhere than on PostgreSQL the
    # move takes a savepoint of its own first, whose name differs).
    def update(captured, job, worker, task):
        sql = next(q["sql"] for q in captured.captured_queries if q["sql"].startswith(("UPDATE", "WITH")))
        return sql.replace(job.pk.hex, "X").replace(worker, "W").replace(task, "T").split(" i AS (")[0]

    assert update(one, first, "w1 pid 1", "t-1") == update(two, second, "w2 pid 2", "t-2")
    completed = job_complete(job=claimed, result={"n": 2})
    assert completed.status == "completed" and completed.result == {"n": 2}


def test_the_check_catches_a_kept_statement_that_differs_from_the_orms(monkeypatch, settings):
    first, second = _pending(2, monkeypatch)
    job_claim(job_id=first.pk, worker="w1", task_id="t-1")
    (key, kept), = statements._kept.items()
    # Swap two of the move's own values (the worker and the task id): a wrong statement.
    slots = list(kept.slots)
    worker = next(i for i, slot in enumerate(slots) if slot[1] == "worker")
    task = next(i for i, slot in enumerate(slots) if slot[1] == "task_id")
    slots[worker], slots[task] = (slots[task][0], *slots[worker][1:]), (slots[worker][0], *slots[task][1:])
    statements._kept[key] = replace(kept, slots=tuple(slots))

    settings.JOBS_CHECK_MOVE_STATEMENTS = True
    with pytest.raises(AssertionError, match="differs from the ORM's"):
        job_claim(job_id=second.pk, worker="w2", task_id="t-2")


class _Twice(Func):
    template = "(%(expressions)s * 2)"
    output_field = IntegerField()


def test_what_is_not_kept_is_built_by_the_orm_every_time(monkeypatch):
    job, = _pending(1, monkeypatch)
    rows = MoveRows(job_id=job.pk, sources=frozenset({"pending"}))
    fields = {"hand_backs": _Twice(F("hand_backs")), "event_seq": F("event_seq") + 1}
    for _ in range(2):
        sql, params = move_statement(rows, fields, connection)
        assert "* 2" in sql
    assert statements._kept == {}, "an expression of an unknown kind was kept"
    # A model instance as a value, and a condition holding one, are not kept either.
    assert statements._value_kind(job) is None
    assert MoveRows(job_id=job.pk, sources=frozenset({"pending"}), where=_q_with(job)).shape() is None
    # Nor a condition the WHERE leaves out (always true for the column's range).
    from django.db.models import Q

    move_statement(MoveRows(job_id=job.pk, sources=frozenset({"pending"}), where=Q(max_attempts__gte=-1)),
                   {"event_seq": F("event_seq") + 1}, connection)
    assert statements._kept == {}
    # The move itself works as before.
    moved = job_transition(job_id=job.pk, to="cancelled", fields={"hand_backs": _Twice(F("hand_backs"))})
    assert moved.status == "cancelled"


def _q_with(value):
    from django.db.models import Q

    return Q(parent=value)


def test_a_full_cache_is_dropped_not_grown(monkeypatch):
    monkeypatch.setattr(statements, "MAX_SHAPES", 3)
    jobs = _pending(5, monkeypatch)
    for index, job in enumerate(jobs):
        # A different `where` each time: a new shape each time.
        from django.db.models import Q

        job_transition(job_id=job.pk, to="cancelled", where=Q(max_attempts__lte=100 + index))
        assert len(statements._kept) <= 3
    assert all(Job.objects.get(pk=job.pk).status == "cancelled" for job in jobs)


def test_a_runs_progress_reports_reuse_one_statement(monkeypatch):
    from jobs.events import event_append

    job, = _pending(1, monkeypatch)
    claimed = job_claim(job_id=job.pk, worker="w", task_id="t")
    built = count_builds(monkeypatch)
    for fraction in (0.25, 0.5, 0.75):
        event_append(job_id=job.pk, type="progress", message={"fraction": fraction}, run_attempt=claimed.attempts,
                     fields={"progress_fraction": fraction, "progress_text": f"{fraction}"})
    assert len(built) == 1
    job.refresh_from_db()
    assert (job.progress_fraction, job.progress_text, job.event_seq) == (0.75, "0.75", claimed.event_seq + 3)


def test_a_runs_steps_reuse_their_statements_each_with_its_own_step(monkeypatch):
    from jobs.events import STEP_NOT_DONE, step_begin, step_checkpoint

    job, = _pending(1, monkeypatch)
    claimed = job_claim(job_id=job.pk, worker="w", task_id="t")
    built = count_builds(monkeypatch)
    for number in range(3):
        assert step_begin(job_id=job.pk, run_attempt=claimed.attempts, step=f"s{number}") is STEP_NOT_DONE
        assert step_checkpoint(job_id=job.pk, run_attempt=claimed.attempts, step=f"s{number}",
                               value={"n": number}) == {"n": number}
    if connection.vendor == "postgresql":
        assert len(built) == 2, "a step's begin and its checkpoint were built more than once each"
    # A finished step is not begun again, and its stored result wins over a second one.
    assert step_begin(job_id=job.pk, run_attempt=claimed.attempts, step="s1") == {"n": 1}
    assert step_checkpoint(job_id=job.pk, run_attempt=claimed.attempts, step="s1", value={"n": 99}) == {"n": 1}
    job.refresh_from_db()
    assert job.checkpoint == {"s0": {"n": 0}, "s1": {"n": 1}, "s2": {"n": 2}}


def test_a_column_written_with_the_name_of_a_condition_keeps_its_own_value(monkeypatch):
    first, second = _pending(2, monkeypatch)
    claimed = [job_claim(job_id=job.pk, worker="w", task_id="t") for job in (first, second)]
    for job, attempts in zip(claimed, (7, 9), strict=True):
        # Fenced to the run's attempt, and writing `attempts` as a plain value.
        job_transition(job_id=job.pk, to="pending", from_=["processing"], only_attempt=job.attempts,
                       fields={"attempts": attempts})
    assert [Job.objects.get(pk=job.pk).attempts for job in claimed] == [7, 9]


def test_a_claims_shape_is_worked_out_once_on_the_objects_it_passes_again(monkeypatch):
    """The claim's condition and the clock's times are the same objects from one claim to the
    next, and the shape worked out from them (their `repr`) is kept on them: a second claim
    neither builds its statement nor works out a condition's or an expression's shape again."""
    first, second, third = _pending(3, monkeypatch)
    job_claim(job_id=first.pk, worker="w", task_id="t")
    worked_out: list = []
    for name in ("_where_shape", "_expression_kind"):
        real = getattr(statements, name)
        monkeypatch.setattr(statements, name, lambda thing, real=real: worked_out.append(thing) or real(thing))
    built = count_builds(monkeypatch)
    job_claim(job_id=second.pk, worker="w", task_id="t")
    assert (worked_out, built) == ([], [])
    # A clock moved by a test (jobs.testing.Clock) gives other objects, whose shape is worked out anew.
    from datetime import timedelta

    from jobs.clock import clock_shift

    with clock_shift(lambda: timedelta(seconds=5)):
        claimed = job_claim(job_id=third.pk, worker="w", task_id="t")
    assert worked_out and claimed.status == Job.Status.PROCESSING


def test_a_copy_of_an_expression_has_its_shape_worked_out_again():
    """`copy.copy` takes the kept shape along with the `__dict__`; the copy, which may then be
    changed, gets its own."""
    import copy

    from django.db.models import Value

    original = F("attempts") + 1
    assert statements._value_kind(original) == ("expression", repr(original))
    changed = copy.copy(original)
    changed.rhs = Value(2)
    assert statements._value_kind(changed) == ("expression", repr(changed)) != statements._value_kind(original)


def test_wakes_of_different_waits_share_one_statement_and_each_wakes_only_its_own(monkeypatch):
    """The wait or question a resume names is a value of its statement, not of its shape: before,
    every answer and every wake was built by the ORM anew and kept under a shape of its own."""
    from jobs.errors import InvalidTransition
    from jobs.services import job_wake

    jobs = _pending(3, monkeypatch)
    for job, key in zip(jobs, ["wait:a", "wait:b", "wait:c"], strict=True):
        claimed = job_claim(job_id=job.pk, worker="w", task_id="t")
        job_transition(job_id=job.pk, to=Job.Status.WAITING, from_=[Job.Status.PROCESSING],
                       only_attempt=claimed.attempts, fields={"suspended_on": key})
    built = count_builds(monkeypatch)
    assert job_wake(job_id=jobs[0].pk, on="wait:a").status == Job.Status.PENDING
    assert job_wake(job_id=jobs[1].pk, on="wait:b").status == Job.Status.PENDING
    assert len(built) == 1
    with pytest.raises(InvalidTransition):
        job_wake(job_id=jobs[2].pk, on="wait:a")  # parked on another wait
    jobs[2].refresh_from_db()
    assert jobs[2].status == Job.Status.WAITING


def test_a_condition_on_the_attempt_given_as_where_keeps_its_own_value(monkeypatch):
    """Only a move's own run (`only_attempt`) fills the attempt's place at a reuse; an attempt
    compared in `where` is part of the shape, value and all."""
    from django.db.models import Q

    first, second = _pending(2, monkeypatch)
    for job in (first, second):
        job_claim(job_id=job.pk, worker="w", task_id="t")
    rows = [MoveRows(job_id=job.pk, sources=frozenset({Job.Status.PROCESSING}), where=Q(attempts=1))
            for job in (first, second)]
    fields = {"event_seq": F("event_seq") + 1}
    move_statement(rows[0], fields, connection)
    sql, params = move_statement(rows[1], fields, connection)  # kept: the same shape
    assert 1 in params and None not in params


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement submit is PostgreSQL's")
def test_a_new_jobs_insert_is_kept_and_still_checked_against_the_compiler(monkeypatch, settings, django_user_model):
    from unittest import mock

    from django.db import connections
    from django.db.models.sql.compiler import SQLInsertCompiler

    from jobs.events import _NEW_JOB
    from jobs.models import JobEvent

    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    owner = django_user_model.objects.create(username="kept-insert")
    job_submit(kind="demo.noop", input={})  # the first on this connection builds it
    settings.JOBS_CHECK_MOVE_STATEMENTS = False
    # Neither the compiler nor `Model.__init__`: the kept text, and the job built from its values.
    with mock.patch.object(SQLInsertCompiler, "as_sql", side_effect=AssertionError("built again")), \
            mock.patch.object(Job, "__init__", side_effect=AssertionError("Model.__init__")):
        job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1}, owner=owner, idempotency_key="k")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.kind, stored.input, stored.status, stored.event_seq, stored.owner_id, stored.idempotency_key) == (
        "demo.sleep", {"seconds": 0, "steps": 1}, "pending", 1, owner.pk, "k")
    assert stored.updated_at is not None and not job._state.adding and job._state.db == "default"
    for field in Job._meta.concrete_fields:  # the instance holds what the row does, every column
        assert getattr(job, field.attname) == getattr(stored, field.attname), field.attname
    first = JobEvent.objects.get(job=job)
    assert (first.seq, first.type, first.status, first.message) == (1, "status", "pending", {})
    assert abs((first.created_at - job.created_at).total_seconds()) < 5
    again, created = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1}, owner=owner, idempotency_key="k")
    assert (again.pk, created) == (job.pk, False)

    # A kept text that is not the compiler's is caught where the check is on (the test settings).
    settings.JOBS_CHECK_MOVE_STATEMENTS = True
    plan = connections["default"].__dict__[_NEW_JOB._key]
    monkeypatch.setattr(plan, "sql", plan.sql.replace("'pending'", "'paused'", 1))
    with pytest.raises(AssertionError, match="differs from the compiler's"):
        job_submit(kind="demo.noop", input={})


def test_a_value_of_a_plain_type_is_a_parameter_and_a_subclass_is_looked_at():
    from datetime import UTC, datetime

    from jobs.statements import _value_kind

    for value in ("processing", 3, 2.5, {"a": 1}, [1], datetime.now(UTC), uuid.uuid4()):
        assert _value_kind(value) == "value", value
    # Constants: a choice of the column written, no string, no JSON, a boolean.
    assert _value_kind("processing", "status") == _value_kind(Job.Status.PROCESSING, "status") \
        == ("constant", "processing")
    assert type(_value_kind(Job.Status.PROCESSING, "status")[1]) is str
    assert _value_kind("processing", "worker") == "value"  # not a choice of that column
    assert _value_kind("", "worker") == ("constant", "")
    assert _value_kind({}, "result") == ("constant", dict, None) != _value_kind([], "result")
    assert _value_kind(True) == ("constant", bool, True) != _value_kind(False)

    class Clever(str):  # a str that is also an expression: not a plain parameter
        def resolve_expression(self, *args, **kwargs):
            return F("status")

    assert _value_kind(Clever("x")) is None  # not a known expression: the ORM builds the move
    assert _value_kind(None) == "null"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg writes the literals")
def test_a_moves_constants_are_written_in_and_its_free_values_sent(monkeypatch):
    """The status a move writes, an empty string, an empty JSON and its event's type and status
    go into the kept text as literals (no parameter to dump and bind each time); the worker, the
    task, the job's id and the event's time go as parameters. Each constant is part of the shape:
    another status is another statement."""
    from dbkit.prepared import prepared_fetch

    first, second = _pending(2, monkeypatch)
    sent: list = []
    monkeypatch.setattr("jobs.models.prepared_fetch",
                        lambda conn, sql, params, **kw: sent.append((sql, list(params))) or prepared_fetch(
                            conn, sql, params, **kw))
    claimed = job_claim(job_id=first.pk, worker="w1 pid 1", task_id="t-1")
    job_complete(job=claimed, result={})
    job_complete(job=job_claim(job_id=second.pk, worker="w2 pid 2", task_id="t-2"), result={"n": 2})
    (claim, claim_params), (complete, complete_params), (claim2, _), (complete2, complete2_params) = sent

    assert claim == claim2, "the second claim did not reuse the first's text"
    assert "\"status\" = 'processing'" in claim and "\"suspended_on\" = ''" in claim
    assert "'status', '', 'processing', '{}'::jsonb, %s FROM j" in claim
    assert "\"status\" = 'completed'" in complete and "\"result\" = '{}'::jsonb" in complete
    assert {"w1 pid 1", "t-1", first.pk} <= set(claim_params)
    assert not {"", "processing", "status"} & {p for p in claim_params if isinstance(p, str) and p != "pending"}
    # A result that is not empty is a value of the statement, not a constant of its text.
    assert complete2 != complete and "\"result\" = %s" in complete2
    assert any(getattr(p, "obj", None) == {"n": 2} for p in complete2_params)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.result, first.suspended_on, second.result) == ("completed", {}, "", {"n": 2})
    from jobs.models import JobEvent

    assert list(JobEvent.objects.filter(job=first).values_list("seq", "type", "step", "status", "message")) == [
        (1, "status", "", "pending", {}), (2, "status", "", "processing", {}), (3, "status", "", "completed", {})]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg writes the literals")
def test_the_check_catches_a_kept_constant_that_is_not_the_moves_own(monkeypatch, settings):
    first, second = _pending(2, monkeypatch)
    job_claim(job_id=first.pk, worker="w1", task_id="t-1")
    (key, kept), = statements._kept.items()
    assert kept.literals, "the claim wrote no constant in"
    statements._kept[key] = replace(kept, sql=kept.sql.replace("'processing'", "'pending'", 1))
    settings.JOBS_CHECK_MOVE_STATEMENTS = True
    with pytest.raises(AssertionError, match="differs from the ORM's"):
        job_claim(job_id=second.pk, worker="w2", task_id="t-2")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg writes the literals")
def test_a_constant_written_in_keeps_the_texts_percent_signs_and_other_places():
    sql = "a = %s AND b LIKE 'x%%' AND c = %s AND d = %s"
    written = statements._written_in(sql, ["50%", 3, "it's"], {0, 2}, connection)
    assert written == "a = '50%%' AND b LIKE 'x%%' AND c = %s AND d = 'it''s'"
    assert statements._shifted(((0, "a", None), (1, "c", None), (2, "d", None)), {0, 2}) == ((0, "c", None),)
