"""Jobs, their status machine and their event log.

Only `jobs.services.job_transition` writes `Job.status`; a test greps for other writers.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from django.conf import settings
from django.db import connections, models
from django.db.models import CharField, F, Func, Q, Value
from django.db.models.functions import Now
from django.db.models.lookups import In
from django.db.models.sql import UpdateQuery

from dbkit.instances import DecodedWhenReadModel, JSONDecodedWhenRead, column_converters, converted, instance_from_row
from dbkit.per_connection import once_per_connection
from dbkit.prepared import prepared_fetch
from jobs.followed import EVERYONE, followed_returning
from jobs.presenters import event_text
from jobs.timestamps import iso_utc


class _NotThroughAnIndex(Func):
    """A column as an expression (`status || ''`): the same value, but no index on the column can
    answer a condition on it. See `status_among`."""

    template = "(%(expressions)s || '')"
    output_field = CharField()


def status_among(statuses) -> In:
    """The condition "the job's status is one of `statuses`", for a statement that names its job
    by id (`filter(pk=…)`), as every move does.

    Written on the plain column, PostgreSQL's planner may answer `id = X AND status IN (…)`
    through the `(status, run_after)` index and filter on the id: each claim then reads every
    pending job. It does so whenever its statistics say that status is rare (a new table, or one
    analysed while few jobs waited), which is exactly when a backlog arrives: 3,000 queued jobs
    made every claim read 3,000 rows. Through an expression the status is checked on the one row
    the primary key finds (tests/jobs/test_statement_plans.py)."""
    return In(_NotThroughAnIndex(F("status")), sorted(str(status) for status in statuses))


class JobQuerySet(models.QuerySet):
    def update_returning(self, *, then_insert: tuple[str, list] | None = None,
                         statement: tuple[str, list] | None = None, **fields: Any) -> Job | None:
        """Run one `UPDATE … WHERE … RETURNING *` and return the updated row, or None.

        This is how a job is claimed and moved in one statement: the WHERE clause carries the
        legal source statuses, the UPDATE takes the row lock, and the returned row is what was
        written. Only for filters on the job's own columns (no joins). PostgreSQL and SQLite
        (3.35+) both support RETURNING.

        `then_insert` is `(sql, params)` of an `INSERT … SELECT … FROM j` to run in the same
        statement as a data-modifying CTE (PostgreSQL only), where `j` is the updated row: one
        round trip instead of two. The inserted row's id is then set as `job._inserted_id`.

        `statement`: the `UPDATE … WHERE …` and its parameters, already built (`jobs.statements`);
        then this queryset's filters and `fields` are not used.
        """
        if statement is None:
            query = self.query.chain(UpdateQuery)
            query.add_update_values(fields)
            statement = query.get_compiler(self.db).as_sql()
        return job_update_returning(statement, then_insert=then_insert, using=self.db)


def job_update_returning(statement: tuple[str, list], *, then_insert: tuple[str, list] | None = None,
                         using: str, connection: Any = None, with_json: bool = True,
                         inserts_many: bool = False,
                         then_also: tuple[str, list, str, list] | None = None) -> Job | None:
    """`JobQuerySet.update_returning` of a statement already built, without a queryset (the
    path of every move: `jobs.events.job_update_with_event`). `connection`: `using`'s, when the
    caller has it already. `with_json=False` reads back every column but the JSON ones (the input,
    the checkpoint, ...), which the `Job` then loads from the database if they are read, as a
    deferred field: for a move whose caller reads none of them (a progress report, a log line),
    so that the database does not send them back at each one. `inserts_many`: `then_insert`
    inserts more than one row (a move's two events); `job._inserted_id` is then the list of their
    ids, in the order of their `seq`. `then_also`: `(insert_sql, insert_params, value_sql,
    value_params)`, with `then_insert`: one more `INSERT … SELECT … FROM j` in the same statement
    (a CTE named `a`; a step's row: `jobs.events.step_checkpoint`) and one more value the statement
    returns, `value_sql` (it may read `j` and `a`), set as `job._returned_also` as the database
    sent it."""
    if connection is None:
        connection = connections[using]
    update_sql, params = statement
    reading = _job_row_reading(connection, with_json=with_json)
    columns, attnames, _, followed = reading
    insert_sql = also_sql = also_value = None
    if then_insert is not None:
        insert_sql, insert_params = then_insert
        params = [*params, *insert_params]
    if then_also is not None:
        if then_insert is None:
            raise ValueError("then_also goes with then_insert (the move's event)")
        also_sql, also_params, also_value, value_params = then_also
        params = [*params, *also_params, *value_params]
    sql = _returning_statement(update_sql, insert_sql, columns, inserts_many, also_sql, also_value)
    row = prepared_fetch(connection, sql, params, one=True)
    if row is None:
        return None
    count = len(attnames)
    extra = count + 2 if followed else count  # the inserted events' ids, then the value of `then_also`
    job = job_from_row(row, using=using, connection=connection, reading=reading)
    job._inserted_id = row[extra] if then_insert is not None else None
    # Who follows it, as the statement found (`jobs.followed`): its events' pushes go only there.
    job._followed = (row[count], row[count + 1]) if followed else EVERYONE
    if then_also is not None:
        job._returned_also = row[extra + 1]
    return job


# The whole statement of an UPDATE (and INSERT) text, the same string object each time they are
# the same (kept texts: `jobs.statements`), which lets its cursor keep its adapters
# (`dbkit.prepared`). The texts of statements that are not kept come and go (the least used first).
MAX_RETURNING_STATEMENTS = 512


@functools.lru_cache(maxsize=MAX_RETURNING_STATEMENTS)
def _returning_statement(update_sql: str, insert_sql: str | None, columns: str, inserts_many: bool = False,
                         also_sql: str | None = None, also_value: str | None = None) -> str:
    sql = f"{update_sql} RETURNING {columns}"
    also = "" if also_sql is None else f", a AS ({also_sql})"
    value = "" if also_value is None else f", {also_value}"
    if insert_sql is not None and inserts_many:
        sql = (f"WITH j AS ({sql}), i AS ({insert_sql} RETURNING id, seq){also} "
               f"SELECT j.*, (SELECT array_agg(i.id ORDER BY i.seq) FROM i){value} FROM j")
    elif insert_sql is not None:
        sql = f"WITH j AS ({sql}), i AS ({insert_sql} RETURNING id){also} SELECT j.*, i.id{value} FROM j CROSS JOIN i"
    return sql


def job_from_row(row: Any, *, using: str, connection: Any, reading: tuple | None = None) -> Job:
    """The `Job` a row read back by `job_update_returning` holds (the fields of `reading` first, in
    their order; one left out is deferred): what a queryset does to a fetched row, without the
    cost of a RawQuerySet (this is the hot path of every status change), the backend's and the
    fields' converters applied; a JSON column's value (the input, the checkpoint, the result, ...)
    decoded at its first read (`dbkit.instances.JSONDecodedWhenRead`). `reading`:
    `_job_row_reading(connection)`, when the caller has it already."""
    _, attnames, converting, _ = reading or _job_row_reading(connection)
    values = list(row[:len(attnames)])
    undecoded = None
    for index, field, converters, decode in converting:  # `converted`, without a call for each column
        value = values[index]
        if decode is not None and value is not None:
            if undecoded is None:
                undecoded = {}
            undecoded[field.attname] = (value, decode)
            continue
        for converter in converters:
            value = converter(value, field, connection)
        values[index] = value
    return instance_from_row(Job, using, attnames, values, undecoded)


def _job_row_reading(connection, *, with_json: bool = True) -> tuple[str, list[str], tuple, bool]:
    """What reading back a job row on `connection` takes, worked out once per connection: the
    RETURNING list (every concrete field, or with `with_json=False` all but the JSON ones), the
    attribute names in its order, (index, field, converters, decoder) for each column that has
    converters (most have none; the decoder, of a value decoded at its first read:
    `JSONDecodedWhenRead`'s), and whether the list ends with the two "followed" flags
    (`jobs.followed`: on PostgreSQL)."""
    def build() -> tuple[str, list[str], tuple, bool]:
        concrete = [field for field in Job._meta.concrete_fields
                    if with_json or not isinstance(field, JSONDecodedWhenRead)]
        columns = ", ".join(connection.ops.quote_name(field.column) for field in concrete)
        converting = tuple(
            (index, field, tuple(converters),
             functools.partial(converted, field=field, converters=converters, connection=connection)
             if isinstance(field, JSONDecodedWhenRead) else None)
            for index, field in enumerate(concrete) if (converters := column_converters(connection, field)))
        followed = connection.vendor == "postgresql"
        if followed:
            columns += followed_returning(connection)
        return columns, [field.attname for field in concrete], converting, followed

    key = "_taskplatform_job_row_reading" if with_json else "_taskplatform_job_row_reading_without_json"
    return once_per_connection(connection, key, build)


class Job(DecodedWhenReadModel):
    class Status(models.TextChoices):
        PENDING = "pending"
        PROCESSING = "processing"
        PAUSED = "paused", "paused (waiting for a person)"
        WAITING = "waiting", "waiting (parked on an external event or a timer)"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
    # The legal moves, as data. `job_transition` refuses anything else.
    TRANSITIONS: dict[str, frozenset[str]] = {
        Status.PENDING: frozenset({Status.PROCESSING, Status.CANCELLED, Status.FAILED}),
        Status.PROCESSING: frozenset(
            {
                Status.COMPLETED,
                Status.FAILED,
                Status.PAUSED,
                Status.WAITING,
                Status.PENDING,  # a retry after an error, or a run handed back
                Status.CANCELLED,
            }
        ),
        Status.PAUSED: frozenset({Status.PENDING, Status.CANCELLED, Status.FAILED}),
        Status.WAITING: frozenset({Status.PENDING, Status.CANCELLED, Status.FAILED}),
        Status.FAILED: frozenset({Status.PENDING}),  # retried by a person
        Status.CANCELLED: frozenset({Status.PENDING}),  # retried by a person
        Status.COMPLETED: frozenset(),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    input = JSONDecodedWhenRead(default=dict, blank=True)
    result = JSONDecodedWhenRead(null=True, blank=True)
    # {"code": "...", "message": "..."} of the last failure; kept while a retry runs.
    error = JSONDecodedWhenRead(null=True, blank=True)
    progress_fraction = models.FloatField(default=0.0)
    progress_text = models.CharField(max_length=500, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0, help_text="Runs started so far.")
    max_attempts = models.PositiveIntegerField(default=3)
    # Runs handed back without counting as an attempt (the worker shut down, the database went
    # away), since the job was submitted or last retried by a person: bounded by
    # JOBS_HAND_BACK_BUDGET, past which a hand-back counts as a failed attempt.
    hand_backs = models.PositiveIntegerField(default=0)
    # Not indexed on its own: the index of (owner, created_at) starts with it, and every index of
    # this table takes an entry at each of a job's moves (tests/test_indexes.py).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs",
        db_index=False,
    )
    # NULL, not "": the unique constraint must not treat "no key" as one shared key.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # The seq of the job's last event: the next event takes event_seq + 1 under the row lock.
    event_seq = models.PositiveIntegerField(default=0)
    # What a `paused` or `waiting` job is suspended on (`question:<key>`, `wait:<key>`, as the
    # suspending feature names it), so that only that thing resumes it; "" otherwise.
    suspended_on = models.CharField(max_length=250, blank=True, default="")
    # Set (under the job's row lock) once a feature app wrote rows for this job that must close
    # when it finishes (a question, a wait): only then does a move into a finished status run the
    # feature apps' closing hooks (`jobs.extensions`, `before=True`); other jobs finish in one
    # statement.
    feature_rows = models.BooleanField(default=False)
    # When a pending job may next run (a retry's back-off); null means now.
    run_after = models.DateTimeField(null=True, blank=True)
    # The lease of the run in progress: set by the claim, renewed by the worker's heartbeat
    # (`jobs.leases`), cleared when the run ends. A `processing` job whose lease expired lost
    # its worker (kill -9, OOM, a lost host) and is taken back by the reconciler. A
    # `cancelled` job with a live lease still has a run winding down (see JOBS_CANCEL_GRACE).
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Who runs (or last ran) the job: "celery@host pid 123", and the Celery task id, for
    # operators and for terminating a run that ignores a cancellation.
    worker = models.CharField(max_length=200, blank=True, default="")
    task_id = models.CharField(max_length=64, blank=True, default="")
    # Child jobs (`ctx.spawn`, `ctx.map`): the job that spawned this one, and the key it was
    # spawned under (unique per parent: a replay of the parent finds it instead of spawning again).
    # Not indexed on its own: the unique constraint's index starts with parent.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children", db_index=False
    )
    spawn_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # While the job is `waiting` in `ctx.gather`: {"ids": [child ids], "policy": "fail_fast" | "collect"}.
    # A child that ends reads it (under this row's lock) to wake the job exactly once; any move
    # back to `pending` clears it.
    gathering = JSONDecodedWhenRead(null=True, blank=True)
    # The writing host's clock: for people and ordering (a batch's jobs, created in one INSERT,
    # keep their order: one database time would tie them all).
    created_at = models.DateTimeField(auto_now_add=True)
    # The database's clock (`jobs.clock`): the reconciler compares it with that clock (the
    # dispatch grace). Each move sets it itself.
    updated_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Until when a live stream follows this job (the database's clock; `jobs.followed`): a move
    # pushes the job's events to its group only while it is followed. Set under the row lock by
    # the web process that serves the stream, before its first read of the job.
    followed_until = models.DateTimeField(null=True, blank=True, editable=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_unique_idempotency_key_per_owner",
            ),
            models.UniqueConstraint(
                fields=["parent", "spawn_key"],
                condition=Q(parent__isnull=False),
                name="job_unique_spawn_key_per_parent",
            ),
            models.CheckConstraint(
                condition=Q(
                    status__in=["pending", "processing", "paused", "waiting", "completed", "failed", "cancelled"]
                ),
                name="job_status_known",
            ),
            models.CheckConstraint(
                condition=Q(progress_fraction__gte=0) & Q(progress_fraction__lte=1),
                name="job_progress_fraction_0_1",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "run_after"], name="job_status_run_after"),
            models.Index(fields=["owner", "-created_at"], name="job_owner_created"),
            models.Index(fields=["kind", "status"], name="job_kind_status"),
            # The dashboard's durations over the last hour (ops.selectors).
            models.Index(fields=["finished_at"], name="job_finished_at"),
            models.Index(
                fields=["status", "lease_expires_at"],
                condition=Q(lease_expires_at__isnull=False),
                name="job_live_leases",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def progress(self) -> dict[str, Any]:
        return {"fraction": self.progress_fraction, "text": self.progress_text}

    @property
    def checkpoint(self) -> dict[str, Any]:
        """{step name: its JSON result} for every finished `ctx.step`, in the order they finished:
        the job's `JobStep` rows, read from the database at each call (a view, not a field)."""
        if self._state.adding and self._state.db is None:
            return {}
        return dict(self.steps.order_by("id").values_list("name", "result"))


# The longest name of a step (`ctx.step`), as its events' `step` column holds it.
STEP_NAME_MAX = 200
# JSON's null, as a value to write: the ORM writes None as SQL's NULL.
JSON_NULL = Value(None, output_field=models.JSONField())


class JobStep(models.Model):
    """A finished `ctx.step` of a job: its name and JSON result, one row each (the job's
    checkpoint is these rows). A step's write adds its own row, so its cost does not grow with
    the results of the steps before it (bench/README.md, "A row per step"). The first result
    stored for a name wins (`jobs.events.step_checkpoint`); a row never changes once written."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="steps", db_index=False)
    name = models.CharField(max_length=STEP_NAME_MAX)
    result = models.JSONField(blank=True)  # a result of None is JSON's null
    # The run that finished it (the job's `attempts` then), and when (the database's clock).
    attempt = models.PositiveIntegerField(default=0)
    finished_at = models.DateTimeField(db_default=Now())

    class Meta:
        # The constraint's index, (job, name), is the one every read and write of a step uses.
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="jobstep_one_per_name")]

    def __str__(self) -> str:
        return f"step {self.name!r} of job {self.job_id}"


class FollowedGroup(models.Model):
    """Until when a live stream follows a channel group that is not one job's: the feed of
    status changes (`jobs.followed`). Every move reads it, to push to the feed only while
    someone follows it."""

    name = models.CharField(max_length=100, primary_key=True)
    until = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} followed until {self.until:%Y-%m-%d %H:%M:%S}"


class JobEvent(models.Model):
    """One numbered entry of a job's durable event log (see the contract's event types)."""

    class Type(models.TextChoices):
        STATUS = "status"
        PROGRESS = "progress"
        STEP = "step"
        QUESTION = "question"
        WAIT = "wait"
        LOG = "log"

    id = models.BigAutoField(primary_key=True)
    # Not indexed on its own: the unique constraint of (job, seq) starts with it, and a job's
    # every event is an insert into each index (tests/test_indexes.py).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=16, choices=Type.choices)
    step = models.CharField(max_length=STEP_NAME_MAX, blank=True, default="")
    status = models.CharField(max_length=32, blank=True, default="")
    message = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="jobevent_unique_seq")]
        # Jobs per minute by status (the dashboard, metrics) read recent status events.
        indexes = [models.Index(fields=["type", "created_at"], name="jobevent_type_created")]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type} {self.step} {self.status}".strip()

    def as_dict(self) -> dict[str, Any]:
        """The event's JSON (websocket, SSE, broadcast), with `text`, its sentence for people."""
        data = {
            "seq": self.seq,
            "type": self.type,
            "step": self.step or None,
            "status": self.status or None,
            "message": self.message,
            "created_at": iso_utc(self.created_at),
        }
        data["text"] = event_text(data)
        return data
