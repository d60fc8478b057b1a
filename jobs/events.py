"""The job's durable, numbered event log.

An event is a row first: its `seq` is taken from `Job.event_seq` in the same statement that
bumps it, under the job's row lock, inside the caller's transaction, so seqs are 1, 2, 3, …
with no gap and no duplicate however many processes write. Anything pushed to clients is
scheduled only after that transaction commits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import cache, partial
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from dbkit.conf import setting
from dbkit.inserts import NewRow, returned_into
from dbkit.instances import column_converters, converted, instance_from_row
from dbkit.per_connection import once_per_connection
from dbkit.prepared import prepared_cursor, prepared_fetch
from dbkit.values import prepared_checked, save_preparer, sql_literal
from jobs.broadcast import event_publish, events_publish
from jobs.clock import db_now
from jobs.errors import JobNotFound
from jobs.followed import feed_followed
from jobs.models import JSON_NULL, Job, JobEvent, JobStep, job_update_returning
from jobs.statements import (
    NEXT_EVENT_SEQ,
    MoveRows,
    move_statement,
    written_constant,
    written_constants,
)


class RunLost(BaseException):
    """The running attempt no longer owns the job (it was cancelled, or handed to another run).

    A BaseException, like `PauseForResolution`, so job code's `except Exception` does not
    swallow it: the run must stop at once and write nothing more.
    """


def event_record(
    *, job: Job, type: str, step: str = "", status: str = "", message: dict | None = None
) -> JobEvent:
    """Insert the event numbered `job.event_seq` and push it to clients once it commits.

    Precondition: the caller is in a transaction and has just bumped `job.event_seq` under the
    row lock (as `job_transition` and `event_append` do). This is the one place events are
    created, so it is the one place they are published: after the commit, never for a
    rolled-back write, and a failed push never fails the write.
    """
    event = JobEvent(
        job_id=job.pk, seq=job.event_seq, type=type, step=step, status=status, message=message or {},
        created_at=timezone.now(),  # host clock: shown to people, never compared across hosts
    )
    _event_insert(event)
    transaction.on_commit(partial(event_publish, job=job, event=event), robust=True)
    return event


def events_record_first(*, jobs: list[Job]) -> list[JobEvent]:
    """Insert the first event (`status pending`, seq 1) of each of `jobs`, just created with
    `event_seq=1`, in one statement; push each once the transaction commits."""
    now = timezone.now()  # host clock: an event's time is shown to people, never compared across hosts
    events = JobEvent.objects.bulk_create(
        [JobEvent(job_id=job.pk, seq=1, type="status", status=Job.Status.PENDING, message={}, created_at=now)
         for job in jobs]
    )
    transaction.on_commit(partial(events_publish, list(zip(jobs, events, strict=True))), robust=True)
    return events


# A new job's row, made by a submit or a spawn of one child: one INSERT kept per connection, whose
# parameters are the columns these choose and the job's id and time; every other column is written
# into its text (`dbkit.inserts.NewRow`).
NEW_JOB_GIVEN = ("kind", "input", "owner_id", "idempotency_key", "max_attempts", "parent_id", "spawn_key")
_NEW_JOB = NewRow(Job, given=NEW_JOB_GIVEN, fixed={"event_seq": 1})


def job_create_with_first_event(*, kind: str, input: Any, max_attempts: int, owner_id: Any = None,
                                idempotency_key: str | None = None, parent_id: Any = None,
                                spawn_key: str | None = None) -> Job:
    """Insert a new `pending` job and its first event (`status pending`, seq 1); push the event
    once the transaction commits. Returns the job as `save()` leaves it, its database defaults
    filled in. On PostgreSQL one statement, its text kept per connection, built without
    `Model.__init__` (`NewRow`); elsewhere `save()` and the event's INSERT. Precondition: as for
    `jobs_create_with_first_events`."""
    using = Job.objects.db
    connection = connections[using]
    values = [kind, input, owner_id, idempotency_key, max_attempts, parent_id, spawn_key]
    if connection.vendor != "postgresql":
        job = Job(**dict(zip(NEW_JOB_GIVEN, values, strict=True)), event_seq=1)
        job.save(force_insert=True)
        event_record(job=job, type="status", status=Job.Status.PENDING)
        return job
    insert_sql, params, job, returning = _NEW_JOB.insert(connection, using, values,
                                                         check=setting("JOBS_CHECK_MOVE_STATEMENTS"))
    sql = _kept_with_first_events(connection, insert_sql, returning[1:])
    now = timezone.now()  # host clock: an event's time is shown to people, never compared across hosts
    params.append(_event_time(now, connection))
    _first_events_saved([job], prepared_fetch(connection, sql, params), now, returning[1:], connection)
    return job


def jobs_create_with_first_events(*, shared: dict[str, Any], each: Sequence[str],
                                  rows: Sequence[Sequence[Any]]) -> list[Job]:
    """Insert a new `pending` job for each of `rows` and the first event of each (`status
    pending`, seq 1); push each event once the transaction commits. Returns the jobs as `save()`
    leaves them, their database defaults filled in, in the rows' order. The fields of
    `NEW_JOB_GIVEN` are each either in `shared` (the value every job has) or named in `each`
    (each row's values, in that order).

    On PostgreSQL the jobs' INSERT and the events' are one statement (the events' as a CTE over
    the jobs'): a batch is one statement, its text kept per connection for these names. Only what
    differs from job to job goes as an array, one per column (the job's id, its time and `each`),
    the values every job shares as one parameter each, the rest written into the text
    (`dbkit.inserts.NewRow.insert_many`); the jobs are built without `Model.__init__`
    (`manage.py submit --count`: bench/README.md, "A batch's rows"). Elsewhere, `bulk_create` and
    then the events' own INSERT. Precondition: as for `job_update_with_event`, the caller holds a
    transaction or `one_statement_write`.
    """
    if not rows:
        return []
    if len(rows) == 1:  # one job (a spawn of one child): the submit's kept statement, no arrays
        return [job_create_with_first_event(**shared, **dict(zip(each, rows[0], strict=True)))]
    using = Job.objects.db
    connection = connections[using]
    if connection.vendor != "postgresql":
        jobs = [Job(**shared, **dict(zip(each, values, strict=True)), event_seq=1) for values in rows]
        Job.objects.bulk_create(jobs)
        events_record_first(jobs=jobs)
        return jobs
    insert_sql, params, jobs, returning = _NEW_JOB.insert_many(connection, using, shared, each, rows,
                                                               check=setting("JOBS_CHECK_MOVE_STATEMENTS"))
    sql = _kept_with_first_events(connection, insert_sql, returning[1:])
    now = timezone.now()  # host clock: an event's time is shown to people, never compared across hosts
    with prepared_cursor(connection) as cursor:
        cursor.execute(sql, [*params, _event_time(now, connection)])
        fetched = cursor.fetchall()
    _first_events_saved(jobs, fetched, now, returning[1:], connection)
    return jobs


def _first_events_saved(jobs: list[Job], fetched: list, now: Any, returned: list, connection: Any) -> list[JobEvent]:
    """Each of `jobs` marked saved with what its statement (`_with_first_events`) returned, its
    first event made from its row, without `Model.__init__` (`dbkit.instances`), and the events
    pushed once the transaction commits."""
    rows = {row[0]: row[1:] for row in fetched}
    using = JobEvent.objects.db
    events = []
    for job in jobs:
        *values, event_id, feed = rows[job.pk]  # a uuid column, read as the UUID the job holds
        # Nobody can follow a job before it is committed: its first event goes to the feed alone.
        job._followed = (False, feed)
        returned_into(job, returned, values, connection, Job.objects.db)
        events.append(instance_from_row(JobEvent, using, _EVENT_ATTNAMES,
                                        [event_id, job.pk, 1, "status", "", Job.Status.PENDING, {}, now]))
    transaction.on_commit(partial(events_publish, list(zip(jobs, events, strict=True))), robust=True)
    return events


def _event_time(now: Any, connection: Any) -> Any:
    """An event's `created_at` as its INSERT sends it."""
    prepare = once_per_connection(connection, "_taskplatform_event_time",
                                  lambda: save_preparer(JobEvent._meta.get_field("created_at"), connection))
    return prepare(now, connection)


# A first event's columns after its job's id: constants, written into the statement's text, and its time.
_FIRST_EVENT_CONSTANTS = {"seq": 1, "type": "status", "step": "", "status": Job.Status.PENDING.value, "message": {}}


def _kept_with_first_events(connection, insert_sql: str, returned: list) -> str:
    """`_with_first_events` of a kept INSERT's text (`NewRow`'s), kept per connection with it:
    the same string each time, whose cursor keeps its adapters."""
    statements = once_per_connection(connection, "_taskplatform_new_job_statements", dict)
    sql = statements.get(insert_sql)
    if sql is None:
        sql = statements[insert_sql] = _with_first_events(connection, insert_sql, returned)
    return sql


def _with_first_events(connection, insert_sql: str, returned: list) -> str:
    """The jobs' INSERT with their first events' as a CTE over it (the event's time its one
    parameter), returning each job's id, its `returned` columns, its event's id and whether the
    feed is followed (`jobs.followed`)."""
    quote = connection.ops.quote_name
    pk = quote(Job._meta.pk.column)
    constants = ", ".join(sql_literal(JobEvent._meta.get_field(name).get_db_prep_save(value, connection), connection)
                          for name, value in _FIRST_EVENT_CONSTANTS.items())
    return (f"WITH j AS ({insert_sql}), i AS ({_event_insert_prefix(connection)} "
            f"SELECT j.{pk}, {constants}, %s FROM j RETURNING id, job_id) "
            f"SELECT j.{pk}, {''.join(f'j.{quote(field.column)}, ' for field in returned)}i.id, "
            f"{feed_followed(connection)} FROM j JOIN i ON i.job_id = j.{pk}")


_EVENT_COLUMNS = ["job_id", "seq", "type", "step", "status", "message", "created_at"]


def _event_params(event: JobEvent, names: list[str], connection) -> list:
    return [JobEvent._meta.get_field(name).get_db_prep_save(getattr(event, name), connection) for name in names]


def _event_insert_prefix(connection) -> str:
    """`INSERT INTO jobs_jobevent (…)`, quoted for `connection`, built once per connection (every
    move appends an event)."""
    def build() -> str:
        quote = connection.ops.quote_name
        columns = ", ".join(quote(JobEvent._meta.get_field(n).column) for n in _EVENT_COLUMNS)
        return f"INSERT INTO {quote(JobEvent._meta.db_table)} ({columns})"

    return once_per_connection(connection, "_taskplatform_event_insert", build)


# A move's event: the columns after its job's id and number, which the statement writes from
# the updated row (`SELECT j.id, j.event_seq, …`), and every column's attribute in row order.
_MOVE_EVENT_COLUMNS = ["type", "step", "status", "message", "created_at"]
_EVENT_ATTNAMES = ["id", "job_id", "seq", *_MOVE_EVENT_COLUMNS]


def _event_constants(values: list) -> tuple:
    """For each of a move's event's values (`_MOVE_EVENT_COLUMNS`): the constant it is, by the
    rule of a move's own statement (`jobs.statements.written_constant`: each parameter sent costs
    a dumper and a binding), or None where it goes as a parameter. An event's status is a job's."""
    type_, step, status, message, _ = values
    type_, step, message = written_constants((("type", type_), ("step", step), ("message", message)), JobEvent)
    return type_, step, written_constant(status, "status", Job), message, None


def _move_event_insert(connection, values: list, before: list | None = None) -> tuple[str, list]:
    """The `INSERT … SELECT … FROM j` of a move's event (`job_update_with_event`) with `values`'
    constants written in (`_event_constants`), and (index in `values`, field, preparer) of each
    of its parameters, in order (`dbkit.values`): built once per connection and constants. With
    `before` (another event's values), that event first, numbered one before the move's: the
    indexes are then in `[*before, *values]`."""
    built = once_per_connection(connection, "_taskplatform_move_event_inserts", dict)
    events = [values] if before is None else [before, values]
    constants = tuple(_event_constants(event) for event in events)
    found = built.get(constants)
    if found is None:
        fields = [JobEvent._meta.get_field(name) for name in _MOVE_EVENT_COLUMNS]
        selects, parameters = [], []
        for number, (event, event_constants) in enumerate(zip(events, constants, strict=True)):
            written = []
            for index, (field, constant) in enumerate(zip(fields, event_constants, strict=True)):
                prepare = save_preparer(field, connection)
                if constant is None:
                    written.append("%s")
                    parameters.append((number * len(fields) + index, field, prepare))
                else:
                    written.append(sql_literal(prepare(event[index], connection), connection))
            earlier = len(events) - 1 - number  # how many of the move's events come after this one
            seq = f"j.event_seq - {earlier}" if earlier else "j.event_seq"
            selects.append(f"SELECT j.id, {seq}, {', '.join(written)} FROM j")
        sql = f"{_event_insert_prefix(connection)} {' UNION ALL '.join(selects)}"
        found = built[constants] = (sql, parameters)
    return found


def _event_saved(event: JobEvent, pk: int) -> None:
    event.pk = pk
    event._state.adding = False
    event._state.db = JobEvent.objects.db


def _event_insert(event: JobEvent) -> None:
    """INSERT one event row directly: Model.save's machinery cost more than the statement on
    this hot path (several events per job). Fills in `event.pk`."""
    connection = connections[JobEvent.objects.db]
    placeholders = ", ".join(["%s"] * len(_EVENT_COLUMNS))
    with connection.cursor() as cursor:
        cursor.execute(
            f"{_event_insert_prefix(connection)} VALUES ({placeholders}) RETURNING id",
            _event_params(event, _EVENT_COLUMNS, connection),
        )
        _event_saved(event, cursor.fetchone()[0])


# An event a move writes before its own, in the same statement: (type, step, status, message).
EarlierEvent = tuple[str, str, str, dict | None]


def job_update_with_event(
    *, rows: MoveRows, fields: dict[str, Any], type: str, step: str = "", status: str = "",
    message: dict | None = None, with_json: bool = True, before: EarlierEvent | None = None,
    then_also: tuple[str, list, str, list] | None = None,
) -> tuple[Job, JobEvent] | None:
    """Update the one job `rows` selects and append its event, numbered by the updated
    `event_seq`; publish the event once the transaction commits. Returns both rows, or None
    when no job matched.

    Precondition: the caller holds a transaction, and `fields` bumps `event_seq` (by two with
    `before`). On PostgreSQL the update and the insert are one statement (a data-modifying CTE):
    this is the path every status change and every progress report takes. The UPDATE is the one
    kept for its shape (`jobs.statements.move_statement`). `with_json=False`: the job is read back
    without its JSON columns (`jobs.models.job_update_returning`), for a caller that reads none of
    them. `before`: an event that comes first, numbered one before the move's own (what made the
    move: a question answered, a wait woken), written and published with it, or not at all.
    `then_also`: one more row to insert and one more value to read back, in the same statement
    (PostgreSQL: `job_update_returning`).
    """
    now = timezone.now()  # host clock: shown to people, never compared across hosts
    using = Job.objects.db
    connection = connections[using]
    statement = move_statement(rows, fields, connection)
    values = [type, step, status, message or {}, now]
    earlier_values = None if before is None else [*before[:3], before[3] or {}, now]
    if connection.vendor == "postgresql":
        # The event's row is made from what the statement wrote, as `from_db` would (no
        # `Model.__init__` per move: `dbkit.instances`).
        sql, parameters = _move_event_insert(connection, values, earlier_values)
        every = values if before is None else [*earlier_values, *values]
        if setting("JOBS_CHECK_MOVE_STATEMENTS"):
            params = [prepared_checked(field, prepare, every[index], connection)
                      for index, field, prepare in parameters]
        else:
            params = [prepare(every[index], connection) for index, _, prepare in parameters]
        job = job_update_returning(statement, then_insert=(sql, params), using=using, connection=connection,
                                   with_json=with_json, inserts_many=before is not None,
                                   then_also=then_also)
        if job is None:
            return None
        # The events' rows are in the job's database: the statement wrote them.
        if before is None:
            event_ids, earlier = [job._inserted_id], None
        else:
            event_ids = job._inserted_id
            earlier = instance_from_row(JobEvent, using, _EVENT_ATTNAMES,
                                        [event_ids[0], job.pk, job.event_seq - 1, *earlier_values])
        event = instance_from_row(JobEvent, using, _EVENT_ATTNAMES, [event_ids[-1], job.pk, job.event_seq, *values])
    else:
        event = JobEvent(type=type, step=step, status=status, message=message or {}, created_at=now)
        jobs = Job.objects.all()
        job = jobs.update_returning(statement=statement)
        if job is None:
            return None
        earlier = None
        if before is not None:
            earlier = JobEvent(job_id=job.pk, seq=job.event_seq - 1, type=earlier_values[0], step=earlier_values[1],
                               status=earlier_values[2], message=earlier_values[3], created_at=now)
            _event_insert(earlier)
        event.job_id, event.seq = job.pk, job.event_seq
        _event_insert(event)
    # After the commit of the write's own connection (`transaction.on_commit` without `using`
    # would look the default one up again).
    if earlier is None:
        connection.on_commit(partial(event_publish, job=job, event=event), robust=True)
    else:
        connection.on_commit(partial(events_publish, [(job, earlier), (job, event)]), robust=True)
    return job, event


def one_statement_write() -> AbstractContextManager:
    """The transaction around a write that is ONE statement on PostgreSQL (a job's UPDATE with its
    event's INSERT as a CTE, `job_update_with_event`): none of its own. Outside a transaction the
    statement runs in autocommit, atomic on its own, and its after-commit work (the push, a
    dispatch) runs right after it, as after a COMMIT: the BEGIN and the COMMIT round trips are
    saved. Inside the caller's transaction it takes no savepoint (two more round trips): a
    refusal found in Python (no row matched) leaves the caller's transaction as it was, and a
    statement that fails aborts it, as any failed statement does; a caller that must survive a
    failed write opens its own `atomic` around it. Elsewhere (SQLite: two statements) a
    transaction of its own."""
    if _vendor(DEFAULT_DB_ALIAS) == "postgresql":
        return nullcontext()
    return transaction.atomic()


@cache
def _vendor(alias: str) -> str:
    """The vendor of the database `alias` (fixed for the process; every move asks)."""
    return connections[alias].vendor


def event_append(
    *,
    job_id: Any,
    type: str,
    step: str = "",
    status: str = "",
    message: dict | None = None,
    fields: dict | None = None,
    run_attempt: int | None = None,
) -> JobEvent:
    """Append one event to a job's log, updating `fields` of the job in the same statement.

    With `run_attempt`, the write is fenced to the run that owns the job: when the job is no
    longer `processing` under that attempt (cancelled, or reclaimed), nothing is written and
    `RunLost` is raised so the run stops.
    """
    with one_statement_write():
        if run_attempt is None:
            rows = MoveRows(job_id=job_id, sources=None)
        else:
            rows = MoveRows(job_id=job_id, sources=frozenset({Job.Status.PROCESSING}), only_attempt=run_attempt)
        values = {"event_seq": NEXT_EVENT_SEQ, "updated_at": db_now(), **(fields or {})}
        # Its caller reads the event, not the job: the job's input and result (however big)
        # are not sent back at each progress report, log line or step event.
        written = job_update_with_event(rows=rows, fields=values, type=type, step=step, status=status, message=message,
                                        with_json=False)
        if written is None:
            if run_attempt is not None:
                raise RunLost(f"job {job_id} is no longer run by attempt {run_attempt}")
            raise JobNotFound(f"job {job_id} does not exist")
        return written[1]


STEP_NOT_DONE = object()


def _step_insert(connection: Any) -> tuple[str, str]:
    """A step's row, written by the statement that records the step (`step_checkpoint`): the
    `INSERT … SELECT … FROM j` (parameters: the name, the result's JSON text), which writes
    nothing when the job already has a step of that name (the first stored result wins), and the
    value the statement returns, the stored result: the one it wrote or the one already there
    (parameter: the name). Built once per connection."""
    def build() -> tuple[str, str]:
        quote = connection.ops.quote_name
        table = quote(JobStep._meta.db_table)
        job, name, result, attempt = (quote(JobStep._meta.get_field(field).column)
                                      for field in ("job", "name", "result", "attempt"))
        pk, attempts = quote(Job._meta.pk.column), quote(Job._meta.get_field("attempts").column)
        insert = (f"INSERT INTO {table} ({job}, {name}, {result}, {attempt}) "
                  f"SELECT j.{pk}, %s, %s::jsonb, j.{attempts} FROM j "
                  f"ON CONFLICT ({job}, {name}) DO NOTHING RETURNING {result}")
        stored = (f"COALESCE((SELECT a.{result} FROM a), "
                  f"(SELECT s.{result} FROM {table} s WHERE s.{job} = j.{pk} AND s.{name} = %s))")
        return insert, stored

    return once_per_connection(connection, "_taskplatform_step_insert", build)


def steps_finished(job_id: Any) -> dict[str, Any]:
    """{name: stored result} of the job's finished steps, in the order they finished: what a run
    loads at its first `ctx.step` (`jobs.runtime.JobContext`)."""
    return dict(JobStep.objects.filter(job_id=job_id).order_by("id").values_list("name", "result"))


def _step_stored(job_id: Any, step: str) -> Any:
    """The stored result of the job's finished step `step`, read on its own."""
    return JobStep.objects.get(job_id=job_id, name=step).result


def step_begin(*, job_id: Any, run_attempt: int, step: str) -> Any:
    """Write the `step started` event of the run `run_attempt`, unless `step` has finished
    already (another run of the job finished it after this run loaded the checkpoint): then
    return its stored result and write nothing. Returns `STEP_NOT_DONE` when the step is to run.
    Raises `RunLost` when the run no longer owns the job. One statement on PostgreSQL
    (`one_statement_write`: no BEGIN and COMMIT around it)."""
    with one_statement_write():
        rows = MoveRows(job_id=job_id, sources=frozenset({Job.Status.PROCESSING}), only_attempt=run_attempt,
                        without_step=step)
        fields = {"event_seq": NEXT_EVENT_SEQ, "updated_at": db_now()}
        if job_update_with_event(rows=rows, fields=fields, type="step", step=step, status="started",
                                 with_json=False) is not None:
            return STEP_NOT_DONE
        current = Job.objects.filter(pk=job_id).values("status", "attempts").first()
    if current is None:
        raise JobNotFound(f"job {job_id} does not exist")
    if current["status"] != Job.Status.PROCESSING or current["attempts"] != run_attempt:
        raise RunLost(f"job {job_id} is no longer run by attempt {run_attempt}")
    return _step_stored(job_id, step)


def step_checkpoint(*, job_id: Any, run_attempt: int, step: str, value: Any) -> Any:
    """Record that `step` finished with `value` (the job's `JobStep` row) and its `step completed`
    event; return the step's stored result.

    The first finished result wins: when another run of the job finished `step` first, that
    result stays and is returned; a step's row is never overwritten. The result is kept even when
    the run no longer owns the job (it was cancelled or taken back while the step ran), so that the
    work is never done again (not for a job that completed); then no event is written (the job's
    log has moved on without this run) and `RunLost` is raised so the run stops. Precondition:
    `value` is storable JSON. One statement on PostgreSQL (the job's UPDATE, the event's INSERT
    and the step's, `one_statement_write`), more only when the run has lost the job.
    """
    connection = connections[Job.objects.db]
    owned = MoveRows(job_id=job_id, sources=frozenset({Job.Status.PROCESSING}), only_attempt=run_attempt)
    fields = {"event_seq": NEXT_EVENT_SEQ, "updated_at": db_now()}
    if connection.vendor == "postgresql":
        with one_statement_write():
            # The step's own row is written, not the job's JSON: a step's cost and its WAL do not
            # grow with the results before it (bench/README.md, "A row per step").
            insert, stored = _step_insert(connection)
            written = job_update_with_event(rows=owned, fields=fields, type="step", step=step, status="completed",
                                            with_json=False,
                                            then_also=(insert, [step, json.dumps(value)], stored, [step]))
        if written is not None:
            if written[0]._returned_also is not None:
                field = JobStep._meta.get_field("result")
                return converted(written[0]._returned_also, field, column_converters(connection, field), connection)
            # Stored by a run whose write this statement waited for and could not see: read it now.
            return _step_stored(job_id, step)
    else:  # elsewhere (SQLite, whose writers are serialised): the move, then the row, in one transaction
        with transaction.atomic():
            written = job_update_with_event(rows=owned, fields=fields, type="step", step=step, status="completed")
            if written is not None:
                _step_keep(job_id=job_id, step=step, value=value, attempt=run_attempt)
                return _step_stored(job_id, step)
    # Lost meanwhile: keep the result all the same (not for a job that completed).
    with transaction.atomic():
        kept = Job.objects.select_for_update().filter(pk=job_id).exclude(status=Job.Status.COMPLETED).exists()
        if kept:
            _step_keep(job_id=job_id, step=step, value=value, attempt=run_attempt)
        missing = not kept and not Job.objects.filter(pk=job_id).exists()
    if missing:  # raised after the transaction, which wrote nothing (`job_transition` says why)
        raise JobNotFound(f"job {job_id} does not exist")
    raise RunLost(f"job {job_id} is no longer run by attempt {run_attempt}; the result of step {step!r} is kept")


def _step_keep(*, job_id: Any, step: str, value: Any, attempt: int) -> None:
    """The step's row, unless the job has one of that name (the first stored result wins). A
    result of None is JSON's null (the ORM would write SQL's NULL, which the column refuses)."""
    result = JSON_NULL if value is None else value
    JobStep.objects.bulk_create([JobStep(job_id=job_id, name=step, result=result, attempt=attempt)],
                                ignore_conflicts=True)
