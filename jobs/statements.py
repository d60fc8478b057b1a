"""A move's UPDATE, built by the ORM once per shape and reused with each move's own values.

Every status change and every event a run appends (progress, a question asked or answered) is one
`UPDATE jobs_job SET … WHERE … RETURNING …` (`JobQuerySet.update_returning`).
Building it through the ORM (the queryset's filters, resolving the SET expressions, compiling)
was about half of a pool process's CPU for a no-op job, for a statement whose text is the same
for every claim, every outcome, every resume. So the first move of each *shape* is built by the
ORM as before; the text and the parameters it produced are kept, with the places in the
parameters that hold this move's own values (the job's id, the run's attempt, each plain value
written). A later move of the same shape takes the kept text and puts its values in those places,
prepared by the same field methods the ORM uses.

The shape is everything that decides the text: the source statuses, whether the move is fenced
to an attempt, the extra condition (`where`, by its `repr`), whether it requires no feature rows,
which transition hooks it is fenced from (`unless_needed`, by name: a hook's `needed_when` is the
same condition every time), and, for each column written, whether its value is NULL, a plain
value, which constant (below), or which expression. Only expressions built from the kinds whose
`repr` shows all of them (`F`, `Value`, `Now`, arithmetic on them, `ExpressionWrapper`) and
conditions whose values are plain take part; anything else is built by the ORM every time, as
before.

A value written that is one of a bounded set (a choice of the column's `choices`, such as the
status a move writes; an empty string; an empty JSON object or list; a boolean) is part of the
shape, and on PostgreSQL it is written into the kept text as a literal, as psycopg writes it,
instead of going as a parameter: each parameter sent costs psycopg a dumper and PostgreSQL its
binding, and a no-op job's claim and outcome sent thirteen such constants with their events'
(bench/README.md, "Constants written in"; the events' INSERT does the same: `jobs.events`). Only
those sets: a free value (a worker's name, a result) stays a parameter, and the kept texts stay
few.

Under the test settings (`JOBS_CHECK_MOVE_STATEMENTS`) every reuse is also built by the ORM
and compared, text and parameters (the ORM's with the same constants written in): the whole
suite checks the kept statements.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import EmptyResultSet, FieldDoesNotExist, FullResultSet
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Value
from django.db.models.expressions import Col, CombinedExpression, ExpressionWrapper, NegatedExpression
from django.db.models.functions import Now
from django.db.models.lookups import Exact
from django.db.models.sql.subqueries import UpdateQuery

from dbkit.conf import setting
from dbkit.values import comparable, lookup_preparer, save_preparer, sql_literal
from jobs.extensions import TransitionHook
from jobs.models import Job, JobStep, status_among

# The next event's number: one object for every move, whose shape is worked out once on it.
NEXT_EVENT_SEQ = F("event_seq") + 1
# A move that writes an event before its own (`jobs.events.job_update_with_event`'s `before`).
NEXT_TWO_EVENT_SEQS = F("event_seq") + 2

# Shapes kept per process; past this many (a condition with ever-new values), all are dropped.
MAX_SHAPES = 512
_EXPRESSIONS = (F, Value, Now, CombinedExpression, ExpressionWrapper, Col)
_PLAIN = (type(None), bool, int, float, str, decimal.Decimal, uuid.UUID, datetime.datetime, datetime.date,
          datetime.timedelta)


@dataclass(frozen=True)
class MoveRows:
    """The one job a move selects: by id, in one of `sources` (None: in any status), at run
    `only_attempt` (when given), matching `where` (when given), and holding no feature rows
    (`no_feature_rows`)."""

    job_id: Any
    sources: frozenset[str] | None
    only_attempt: int | None = None
    where: Q | None = None
    no_feature_rows: bool = False
    # A step's begin: only while the job has no finished step (`JobStep`) of this name.
    without_step: str | None = None
    # A resume or a wake: only while the job is suspended on this (`Job.suspended_on`). A value of
    # the statement, not of its shape: every answer and every wake names its own question or wait.
    suspended_on: str | None = None
    # Only where none of these transition hooks is needed (their `needed_when`).
    unless_needed: tuple[TransitionHook, ...] = ()

    def queryset(self) -> QuerySet[Job]:
        if self.sources is None:
            rows = Job.objects.filter(pk=self.job_id)
        else:
            rows = Job.objects.filter(status_among(self.sources), pk=self.job_id)
        if self.only_attempt is not None:
            rows = rows.filter(attempts=self.only_attempt)
        if self.where is not None:
            rows = rows.filter(self.where)
        if self.no_feature_rows:
            rows = rows.filter(feature_rows=False)
        if self.without_step is not None:
            rows = rows.filter(~Exists(JobStep.objects.filter(job_id=OuterRef("pk"), name=self.without_step)))
        if self.suspended_on is not None:
            rows = rows.filter(suspended_on=self.suspended_on)
        for hook in self.unless_needed:
            rows = rows.filter(~hook.needed_when())
        return rows

    def shape(self) -> tuple | None:
        where = None
        if self.where is not None:
            where = _remembered(self.where, "_kept_where", _where_shape)
            if where is None:
                return None
        sources = None if self.sources is None else tuple(sorted(self.sources))
        return (sources, self.only_attempt is not None, where, self.no_feature_rows,
                self.without_step is not None, tuple(hook.name for hook in self.unless_needed),
                self.suspended_on is not None)


@dataclass(frozen=True)
class _Kept:
    sql: str
    params: tuple
    # (index in params, where the value comes from, what prepares it): the source is a column
    # written (its name; prepared by its field's preparer, `dbkit.values`), or a value of the
    # WHERE ("where:pk", "where:attempts", "where:step", "where:suspended_on", prepared as the
    # lookup on its field prepares it, `dbkit.values.lookup_preparer`; no column name has a colon)
    slots: tuple[tuple[int, str, Any], ...]
    # The places in the ORM's parameters whose values are written into `sql` (constants: `_value_kind`)
    literals: frozenset[int] = frozenset()


_kept: dict[tuple, _Kept] = {}


def move_statement(rows: MoveRows, fields: dict[str, Any], connection: Any) -> tuple[str, list]:
    """The `UPDATE … WHERE …` (without RETURNING) that writes `fields` to `rows`, and its
    parameters: kept from an earlier move of the same shape when there is one."""
    key = _key(rows, fields, connection)
    kept = _kept.get(key) if key is not None else None
    if kept is None:
        sql, params, slots = _build(rows, fields, connection)
        if key is not None and slots is not None:
            literals = _literal_places(fields, slots, connection)
            if literals:
                sql = _written_in(sql, params, literals, connection)
                params = [param for index, param in enumerate(params) if index not in literals]
                slots = _shifted(slots, literals)
            if len(_kept) >= MAX_SHAPES:
                _kept.clear()
            _kept[key] = _Kept(sql, tuple(params), slots, frozenset(literals))
        return sql, list(params)
    params = list(kept.params)
    for index, source, prepare in kept.slots:
        # `prepare`: the value's preparer (`dbkit.values`; checked below with the rest).
        if source == "where:pk":
            params[index] = prepare(rows.job_id, connection)
        elif source == "where:attempts":
            params[index] = prepare(rows.only_attempt, connection)
        elif source == "where:step":
            params[index] = rows.without_step
        elif source == "where:suspended_on":
            params[index] = prepare(rows.suspended_on, connection)
        else:  # a value written
            params[index] = prepare(fields[source], connection)
    if setting("JOBS_CHECK_MOVE_STATEMENTS"):
        _check(rows, fields, connection, kept, params)
    return kept.sql, params


def _key(rows: MoveRows, fields: dict[str, Any], connection: Any) -> tuple | None:
    shape = rows.shape()
    if shape is None:
        return None
    kinds = _value_kinds(fields.items())
    if None in kinds:
        return None
    return connection.alias, shape, tuple(zip(fields, kinds, strict=True))


def _remembered(thing: Any, name: str, work_out: Any) -> Any:
    """`work_out(thing)`, kept on `thing` (an expression or a condition) under `name`: a move
    that passes the same object again (`jobs.clock`'s times, a module's constant expressions
    and conditions) does not work its shape out again. The ORM never changes an expression it
    is given (it resolves a copy). A copy of the object (`copy.copy` takes its `__dict__`, and
    the copy may then be changed) is not the object the value was worked out for: the value is
    kept with that object's id, and worked out again for any other."""
    kept = thing.__dict__.get(name)
    if kept is not None and kept[0] == id(thing):
        return kept[1]
    value = work_out(thing)
    thing.__dict__[name] = (id(thing), value)
    return value


def _where_shape(condition: Q) -> str | None:
    return repr(condition) if _plain_condition(condition) else None


def _expression_kind(expression: Any) -> Any:
    return ("expression", repr(expression)) if _known_expression(expression) else None


# Values of these exact types are parameters: none of them is an expression or a model instance
# (their subclasses may be, and go through the checks below).
_PARAMETER_TYPES = frozenset({*_PLAIN, dict, list}) - {type(None)}


def _value_kind(value: Any, column: str = "", model: Any = None) -> Any:
    """How a written value shapes the statement: NULL, a parameter, a constant (`("constant",
    …)`: written into the text), or this expression. `column`: the field of `model` (a job's by
    default) written, whose choices are constants."""
    return _value_kinds(((column, value),), model)[0]


def _value_kinds(written: Iterable[tuple[str, Any]], model: Any = None) -> list:
    """`_value_kind` of each (column, value) of `written`, in one loop: a move works out a dozen
    of them (a function call each was a tenth of its statement's key)."""
    kinds = []
    model = model or Job
    for column, value in written:
        kind = type(value)
        if value is None:
            kinds.append("null")
        elif kind in _PARAMETER_TYPES:
            if kind is str:
                kinds.append(("constant", value) if not value or value in _choices(model, column) else "value")
            elif kind is bool or ((kind is dict or kind is list) and not value):
                kinds.append(("constant", kind, value if kind is bool else None))
            else:
                kinds.append("value")
        elif isinstance(value, str) and not hasattr(value, "resolve_expression") and value in _choices(model, column):
            kinds.append(("constant", str.__str__(value)))  # a member of the field's choices' enum (a `TextChoices`)
        elif hasattr(value, "resolve_expression"):
            kinds.append(_remembered(value, "_kept_kind", _expression_kind))
        elif hasattr(value, "prepare_database_save"):
            kinds.append(None)  # a model instance: the ORM's way
        else:
            kinds.append("value")
    return kinds


def written_constant(value: Any, column: str, model: Any = None) -> tuple | None:
    """The constant `value` is when written to `model`'s (a job's by default) `column`, as part of
    a statement's shape (`_value_kind`), or None where it goes as a parameter. `jobs.events`
    writes a move's event's constants with the same rule."""
    return written_constants(((column, value),), model)[0]


def written_constants(written: Iterable[tuple[str, Any]], model: Any = None) -> list[tuple | None]:
    """`written_constant` of each (column, value) of `written`."""
    return [kind if type(kind) is tuple and kind[0] == "constant" else None for kind in _value_kinds(written, model)]


@functools.cache
def _choices(model: Any, column: str) -> frozenset[str]:
    """The string values of the choices of `model`'s field `column` (none for a field without)."""
    try:
        field = model._meta.get_field(column)
    except FieldDoesNotExist:
        return frozenset()
    if not field.choices:
        return frozenset()
    return frozenset(value for value, _ in field.flatchoices if isinstance(value, str))


def _literal_places(fields: dict[str, Any], slots: tuple, connection: Any) -> set[int]:
    """The places in the ORM's parameters of the written values that are constants
    (`_value_kind`), to be written into the text: on PostgreSQL (psycopg writes the literals)."""
    places: set[int] = set()
    if connection.vendor != "postgresql":
        return places
    for index, source, _ in slots:
        if ":" in source:  # a value of the WHERE
            continue
        if written_constant(fields[source], source) is not None:
            places.add(index)
    return places


_PLACEHOLDER = re.compile(r"%%|%s")


def _written_in(sql: str, params: Any, places: set[int] | frozenset[int], connection: Any) -> str:
    """`sql` with the parameters at `places` written in as literals (`dbkit.values.sql_literal`)."""
    count = -1

    def one(match: re.Match) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%%"
        count += 1
        if count not in places:
            return "%s"
        return sql_literal(params[count], connection)

    return _PLACEHOLDER.sub(one, sql)


def _shifted(slots: tuple, places: set[int]) -> tuple:
    """`slots` without those at `places`, each index moved back past the places before it."""
    return tuple((index - sum(1 for place in places if place < index), source, prepare)
                 for index, source, prepare in slots if index not in places)


def _known_expression(expression: Any) -> bool:
    if not isinstance(expression, _EXPRESSIONS):
        return False
    if isinstance(expression, Value):
        return isinstance(expression.value, _PLAIN)
    if isinstance(expression, F):
        return True  # a column by its name (not an expression: no sources)
    return all(_known_expression(source) for source in expression.get_source_expressions())


def _plain_condition(condition: Q) -> bool:
    for child in condition.children:
        if isinstance(child, Q):
            if not _plain_condition(child):
                return False
            continue
        _, value = child
        if hasattr(value, "resolve_expression"):
            if not _known_expression(value):
                return False
        elif not isinstance(value, _PLAIN):
            return False
    return True


def _compiled(rows: MoveRows, fields: dict[str, Any], connection: Any) -> tuple[Any, Any, str, tuple]:
    query = rows.queryset().query.chain(UpdateQuery)
    query.add_update_values(fields)
    compiler = query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    return query, compiler, sql, params


def _build(rows: MoveRows, fields: dict[str, Any], connection: Any) -> tuple[str, tuple, tuple | None]:
    """The ORM's statement, and where this move's own values sit in its parameters (None: they
    could not be told apart, and the statement is not kept)."""
    query, compiler, sql, params = _compiled(rows, fields, connection)
    if len(query.values) != len(fields) or query.related_updates:
        return sql, params, None
    slots: list[tuple[int, str, Any]] = []
    index = 0
    for name, (field, _model, value) in zip(fields, query.values, strict=True):
        if hasattr(value, "resolve_expression"):
            resolved = value.resolve_expression(query, allow_joins=False, for_save=True)
            index += len(compiler.compile(resolved)[1])
            continue
        prepared = field.get_db_prep_save(value, connection=connection)
        if hasattr(prepared, "as_sql"):
            return sql, params, None
        if prepared is not None:
            slots.append((index, name, save_preparer(field, connection)))
            index += 1
    for child in query.where.children:
        try:
            count = len(compiler.compile(child)[1])
        except (EmptyResultSet, FullResultSet):  # the WHERE leaves such a child out: not kept
            return sql, params, None
        if _is_step_exclusion(child, rows):
            # Its parameters: the subquery's constant (`SELECT 1`) and the step's name, the one
            # string among them.
            compiled = compiler.compile(child)[1]
            names = [place for place, value in enumerate(compiled) if type(value) is str]
            if len(names) != 1 or compiled[names[0]] != rows.without_step:
                return sql, params, None
            slots.append((index + names[0], "where:step", None))
        elif isinstance(child, Exact) and isinstance(child.lhs, Col):
            target = child.lhs.target
            source = _where_slot(target, rows)
            if source is not None:
                if count != 1 or any(taken == source for _, taken, _ in slots):  # a column compared twice
                    return sql, params, None
                slots.append((index, source, lookup_preparer(target, connection)))
        index += count
    if index != len(params):
        return sql, params, None
    if rows.without_step is not None and not any(source == "where:step" for _, source, _ in slots):
        return sql, params, None  # the step's name was not found: a kept text would hold this one's
    return sql, params, tuple(slots)


def _where_slot(target: Any, rows: MoveRows) -> str | None:
    """Where a value compared with the column `target` in the WHERE comes from at a reuse: the
    move's own id, run and suspension (`MoveRows`). None for any other comparison, whose value is
    part of the shape (`where`, by its `repr`): never taken from a `MoveRows` field that is unset."""
    if target.primary_key:
        return "where:pk"
    if target.name == "attempts" and rows.only_attempt is not None:
        return "where:attempts"
    if target.name == "suspended_on" and rows.suspended_on is not None:
        return "where:suspended_on"
    return None


def _is_step_exclusion(child: Any, rows: MoveRows) -> bool:
    """`NOT EXISTS (SELECT 1 … FROM jobs_jobstep WHERE job_id = jobs_job.id AND name = %s)`: the
    WHERE's part for `MoveRows.without_step` (the ORM's `filter(~Exists(...))` is an `exact`
    lookup of the negated `Exists` with True)."""
    if rows.without_step is None or not isinstance(child, Exact) or child.rhs is not True:
        return False
    negated = child.lhs
    exists = getattr(negated, "expression", None)
    if (not isinstance(negated, NegatedExpression) or not isinstance(exists, Exists)
            or exists.query.model is not JobStep):
        return False
    names = [lookup for lookup in exists.query.where.children if isinstance(lookup, Exact)
             and isinstance(lookup.lhs, Col) and lookup.lhs.target.name == "name"]
    return len(exists.query.where.children) == 2 and len(names) == 1 and names[0].rhs == rows.without_step


def _check(rows: MoveRows, fields: dict[str, Any], connection: Any, kept: _Kept, params: list) -> None:
    _, _, expected_sql, expected_params = _compiled(rows, fields, connection)
    sql = kept.sql
    if kept.literals:
        expected_sql = _written_in(expected_sql, expected_params, kept.literals, connection)
        expected_params = [p for i, p in enumerate(expected_params) if i not in kept.literals]
    if sql != expected_sql or [comparable(p) for p in params] != [comparable(p) for p in expected_params]:
        raise AssertionError(f"a kept move statement differs from the ORM's:\n{sql}\n{params}\n"
                             f"{expected_sql}\n{list(expected_params)}")
