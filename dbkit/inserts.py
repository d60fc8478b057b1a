"""One row's INSERT, built by Django's compiler once (per process, for every thread's connection:
`dbkit.per_connection`) and then reused.

A row written on a hot path (an API submit's job, an answer's ledger row) went through
`Model.save` or the compiler every time: the compiler's pass over the fields cost more CPU than
the statement took in PostgreSQL (a twentieth of the web process's CPU per `POST /api/jobs/`; a
fifth of an answer's, with its question's UPDATE; bench/README.md, "The API's submit" and "An
answer's writes in one statement"). `kept_insert` has the compiler build a model's
`INSERT … RETURNING` once per connection for the columns written, and works out only each row's
values, as the compiler does (each field's `pre_save`, then its `get_db_prep_save`, through
the field's kept preparer: `dbkit.values.save_preparer`). Under
`check` (the test settings), the compiler builds it each time as well, and the two must agree.
An answer's ledger row is written so, from the instance its caller built.

`NewRow` goes further for a row whose instance it builds itself (a submit's job): only the
columns its caller chooses are parameters, every other one is written into the kept text, and the
instance is made without `Model.__init__` (bench/README.md, "A new job's row"). Its `insert_many`
writes many such rows in one statement (a batch submit's jobs): an array, unnested, for each
column whose value differs from row to row, one parameter for each value the rows share
(bench/README.md, "A batch's rows").

`returned_into` puts what the statement returned into the instance, through the columns'
converters, as `Model.save` does, and marks it saved.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db.models import DateField, DateTimeField, Field, Model
from django.db.models.sql import InsertQuery

from dbkit.instances import column_converters, converted, instance_from_row
from dbkit.per_connection import once_per_connection
from dbkit.values import comparable, save_preparer, sql_literal


def compiled_insert(connection: Any, model: type[Model], objs: list[Model], written: list, returning: list,
                    raw: bool = False) -> tuple[str, list]:
    """The rows' `INSERT … RETURNING`, as Django's compiler writes it (`raw`: the values as the
    instances hold them, their `pre_save` already done)."""
    query = InsertQuery(model)
    query.insert_values(written, objs, raw=raw)
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = returning
    (sql, params), = compiler.as_sql()
    return sql, list(params)


def kept_insert(connection: Any, instance: Model, written: list, returning: list, *,
                check: bool = False) -> tuple[str, list] | None:
    """`instance`'s INSERT of the `written` fields, returning the `returning` ones: the text kept
    per connection for its model and those columns, and the row's values. None when a value is
    an expression (its SQL is the compiler's to write): build that one with `compiled_insert`.
    With `check`, the compiler builds it too, and a kept text or a value that is not the
    compiler's raises AssertionError."""
    values = [field.pre_save(instance, True) for field in written]
    if any(hasattr(value, "resolve_expression") for value in values):
        return None
    kept = once_per_connection(connection, KEPT, dict)
    key = (type(instance), tuple(field.attname for field in written), tuple(field.attname for field in returning))
    sql = kept.get(key)
    # Each value prepared as its field's `get_db_prep_save` would (`dbkit.values.save_preparer`),
    # the preparers kept with the text.
    preparers = once_per_connection(connection, PREPARERS, dict)
    if key not in preparers:
        preparers[key] = [save_preparer(field, connection) for field in written]
    params = [prepare(value, connection) for prepare, value in zip(preparers[key], values, strict=True)]
    if sql is None or check:
        built_sql, built_params = compiled_insert(connection, type(instance), [instance], written, returning,
                                                  raw=True)
        if check and (built_sql != (sql or built_sql)
                      or [comparable(p) for p in params] != [comparable(p) for p in built_params]):
            raise AssertionError(f"a kept INSERT differs from the compiler's:\n{sql}\n{params}\n"
                                 f"{built_sql}\n{built_params}")
        sql = kept[key] = built_sql
    return sql, params


# The connection's kept INSERT texts, and their values' preparers, by (model, the columns written,
# the columns returned).
KEPT = "_dbkit_kept_inserts"
PREPARERS = "_dbkit_kept_insert_preparers"


def returned_into(instance: Model, returning: list, values: Any, connection: Any, using: str) -> None:
    """Set the `returning` fields of `instance` from the `values` its INSERT returned (as read
    from their columns: through the converters), and mark it saved in the database `using`, as
    `Model.save` leaves it."""
    for field, value in zip(returning, values, strict=True):
        setattr(instance, field.attname, converted(value, field, column_converters(connection, field), connection))
    instance._state.adding = False
    instance._state.db = using


_new_rows = itertools.count()


class NewRow:
    """A new row of `model` whose instance this builds: one INSERT kept per connection, in which
    the caller's values of the `given` fields are the parameters and every other column is what
    `Model.__init__` and `Model.save` would write, worked out once:

    - a field of `fixed` ({attname: value}, a plain immutable value): that value, written into
      the text as a literal;
    - a field with a constant default (not a callable, or `dict` / `list`): the default, a literal;
    - a field with a database default, or the auto-incremented primary key: left to the
      database, and returned;
    - a field whose value is made for each row (a callable default: the primary key's `uuid4`; an
      `auto_now_add` time, its `pre_save`): made here for each row, as Django makes it, and sent.

    A field that `Model.save` would prepare some other way (its own `pre_save`) is refused when
    the plan is made. The instance is built from those values without `Model.__init__`
    (`dbkit.instances.instance_from_row`), its database defaults filled in from the statement's
    RETURNING (`returned_into`). A submit's job was built through `Model.__init__` (a `get_default`
    for each of its 28 fields), then each value was worked out (`pre_save`, a preparer) and sent as
    one of 34 parameters; the floor's sends 3 (bench/README.md, "A new job's row"). With `check`
    (the test settings), the instance is built through `Model.__init__` as well and Django's
    compiler writes its INSERT: the two must agree, text and values, or AssertionError.
    """

    def __init__(self, model: type[Model], given: Sequence[str], fixed: Mapping[str, Any] | None = None) -> None:
        self.model, self.given, self.fixed = model, tuple(given), dict(fixed or {})
        # Its plans' name on each connection: never another's, as an `id()` may be once this one is gone.
        self._key = f"_dbkit_new_row_{next(_new_rows)}"

    def insert(self, connection: Any, using: str, values: Sequence[Any], *,
               check: bool = False) -> tuple[str, list, Model, list]:
        """The INSERT … RETURNING of a new row with the `given` fields' `values` (in `given`'s
        order): its text (the same string each time), its parameters, the instance (to be marked
        saved with what the statement returns: `returned_into(instance, returning, …)`) and the
        `returning` fields (the primary key first)."""
        plan = once_per_connection(connection, self._key, lambda: _NewRowPlan(self, connection))
        row, instance = plan.made(using, plan.row, plan.given_places, values)
        params = [prepare(row[index], connection) for index, prepare in plan.sent]
        if check:
            self._check(connection, plan, instance, row, params)
        return plan.sql, params, instance, plan.returning

    def insert_many(self, connection: Any, using: str, shared: Mapping[str, Any], each: Sequence[str],
                    rows: Sequence[Sequence[Any]], *, check: bool = False) -> tuple[str, list, list[Model], list]:
        """The INSERT … SELECT … FROM UNNEST(…) RETURNING of a new row for each of `rows`, on
        PostgreSQL: `shared` holds the given fields whose value every row has (one parameter
        each), `each` names the others, in the order of each row's values. Every column of a
        field made for each row (the primary key's `uuid4`, an `auto_now_add` time) and of a field
        of `each` is one array; the rest is written into the kept text, as for one row. Returns
        the text (kept per connection for these names), its parameters, the instances (in the
        rows' order; the statement returns its rows in no promised order: match them by primary
        key) and the `returning` fields. With `check`, the first row is built and compiled as
        `insert` checks one: every row is made by the same plan from its own values."""
        plan = once_per_connection(connection, self._key, lambda: _NewRowPlan(self, connection))
        each = tuple(each)
        batch = plan.batches.get((tuple(shared), each))
        if batch is None:
            batch = plan.batches[(tuple(shared), each)] = _Batch(plan, self, tuple(shared), each, connection)
        template = list(plan.row)
        for index, value in zip(batch.shared_places, shared.values(), strict=True):
            template[index] = value
        instances = []
        columns: list[list] = [[] for _ in batch.arrays]
        for values in rows:
            row, instance = plan.made(using, template, batch.each_places, values)
            for column, (index, prepare) in zip(columns, batch.arrays, strict=True):
                column.append(prepare(row[index], connection))
            if check and not instances:
                self._check(connection, plan, instance, row,
                            [prepare(row[index], connection) for index, prepare in plan.sent])
            instances.append(instance)
        params = [prepare(template[index], connection) for index, prepare in batch.scalars]
        return batch.sql, [*params, *columns], instances, plan.returning

    def _check(self, connection: Any, plan: _NewRowPlan, instance: Model, row: list, params: list) -> None:
        # What `Model.__init__` makes of the same given, fixed and per-row values, its defaults its own.
        built = self.model(**{plan.attnames[index]: row[index] for index in plan.chosen})
        written = [field for field in self.model._meta.local_concrete_fields
                   if not field.generated and field.attname not in plan.by_database]
        built_sql, built_params = compiled_insert(connection, self.model, [built], written, plan.returning, raw=True)
        ours = connection.ops.compose_sql(plan.sql, params)
        theirs = connection.ops.compose_sql(built_sql, built_params)
        if ours != theirs:
            raise AssertionError(f"a new row's kept INSERT differs from the compiler's:\n{ours}\n{theirs}")
        for name in plan.attnames:
            if name not in plan.by_database and getattr(instance, name) != getattr(built, name):
                raise AssertionError(f"a new row's {name} is {getattr(instance, name)!r}, "
                                     f"Model.__init__ made {getattr(built, name)!r}")


# The `pre_save`s that give the value the instance holds (a date's and a time's, but for
# `auto_now` and `auto_now_add`, which `_NewRowPlan` takes apart).
_PLAIN_PRE_SAVE = (Field.pre_save, DateField.pre_save, DateTimeField.pre_save)


class _NewRowPlan:
    """What `NewRow.insert` does for each row on one connection, worked out once."""

    def __init__(self, new: NewRow, connection: Any) -> None:
        meta = new.model._meta
        self.model = new.model
        self.attnames = [field.attname for field in meta.concrete_fields]
        place = {name: index for index, name in enumerate(self.attnames)}
        unknown = sorted((set(new.given) | set(new.fixed)) - set(place))
        if unknown:
            raise ValueError(f"{meta.label} has no concrete field {', '.join(unknown)}")
        self.given_places = [place[name] for name in new.given]
        self.row: list[Any] = [None] * len(self.attnames)
        self.fresh: list[tuple[int, Callable[[], Any]]] = []  # (place, what makes its value) for each row
        self.saved_now: list[tuple[int, Any]] = []  # (place, field) of `auto_now_add` times
        self.sent: list[tuple[int, Callable[[Any, Any], Any]]] = []  # (place, preparer) of each parameter
        self.by_database: set[str] = set()
        self.chosen = [*self.given_places, *(place[name] for name in new.fixed)]  # and those made for each row
        self.batches: dict[tuple, _Batch] = {}  # `NewRow.insert_many`'s texts, by its shared and each names
        columns, written = [], []
        self.parts: list[tuple[int, Any]] = []  # (place, field) of each column written, in order
        for field in meta.local_concrete_fields:
            if field.generated:
                continue
            name, index = field.attname, place[field.attname]
            if name not in new.given and (field.has_db_default() or field is meta.auto_field):
                self.by_database.add(name)
                continue
            columns.append(connection.ops.quote_name(field.column))
            self.parts.append((index, field))
            if name in new.given:
                self._send(index, field, connection, written)
            elif getattr(field, "auto_now_add", False) or getattr(field, "auto_now", False):
                self.saved_now.append((index, field))
                self.chosen.append(index)
                self._send(index, field, connection, written)
            elif type(field).pre_save not in _PLAIN_PRE_SAVE:
                raise TypeError(f"{meta.label}.{name} is prepared by its own pre_save: give it")
            elif name in new.fixed:
                self.row[index] = new.fixed[name]
                written.append(sql_literal(field.get_db_prep_save(new.fixed[name], connection), connection))
            elif field.has_default() and callable(field.default) and field.default not in (dict, list):
                self.fresh.append((index, field.get_default))
                self.chosen.append(index)
                self._send(index, field, connection, written)
            else:
                default = field.get_default()
                if isinstance(default, dict | list):
                    self.fresh.append((index, field.get_default))  # each instance its own
                else:
                    self.row[index] = default
                written.append(sql_literal(field.get_db_prep_save(default, connection), connection))
        self.written = written  # each column's literal, or "%s" for a parameter
        self.returning = [meta.pk, *(field for field in meta.db_returning_fields if field is not meta.pk)]
        table = connection.ops.quote_name(meta.db_table)
        self.into = f"INSERT INTO {table} ({', '.join(columns)})"
        self.returning_sql = " RETURNING " + ", ".join(f"{table}.{connection.ops.quote_name(field.column)}"
                                                       for field in self.returning)
        self.sql = f"{self.into} VALUES ({', '.join(written)}){self.returning_sql}"

    def made(self, using: str, template: list, places: list[int], values: Sequence[Any]) -> tuple[list, Model]:
        """A row: `template` with `values` at `places`, and the values made for each row (a
        primary key's `uuid4`, a mutable default, an `auto_now_add` time); and its instance."""
        row = list(template)
        for index, value in zip(places, values, strict=True):
            row[index] = value
        for index, make in self.fresh:
            row[index] = make()
        instance = instance_from_row(self.model, using, self.attnames, row)
        for index, field in self.saved_now:
            row[index] = field.pre_save(instance, True)
        return row, instance

    def _send(self, index: int, field: Any, connection: Any, written: list) -> None:
        self.sent.append((index, save_preparer(field, connection)))
        written.append("%s")


class _Batch:
    """`NewRow.insert_many`'s text on one connection for one split of the given fields into
    `shared` and `each`: what its parameters are, in order (`scalars`: the shared values, each a
    parameter cast to its column's type; `arrays`: a column's values over the rows, an array of
    that type, unnested), worked out once."""

    def __init__(self, plan: _NewRowPlan, new: NewRow, shared: tuple[str, ...], each: tuple[str, ...],
                 connection: Any) -> None:
        if connection.vendor != "postgresql":
            raise NotImplementedError("NewRow.insert_many writes PostgreSQL's UNNEST")
        unknown = sorted((set(shared) | set(each)) - set(new.given))
        missing = sorted(set(new.given) - set(shared) - set(each))
        if unknown or missing or set(shared) & set(each) or len(set(each)) != len(each):
            raise ValueError(f"{new.model._meta.label}: each given field ({', '.join(new.given)}) is to be either "
                             f"shared or in each row, once; shared: {', '.join(shared) or 'none'}; "
                             f"each: {', '.join(each) or 'none'}")
        place = {name: index for index, name in enumerate(plan.attnames)}
        self.shared_places = [place[name] for name in shared]
        self.each_places = [place[name] for name in each]
        preparers = dict(plan.sent)
        self.scalars: list[tuple[int, Any]] = []
        self.arrays: list[tuple[int, Any]] = []
        selected, unnested = [], []
        shared_places = set(self.shared_places)
        for (index, field), literal in zip(plan.parts, plan.written, strict=True):
            if literal != "%s":
                selected.append(literal)
                continue
            # As Django's own UNNEST (its PostgreSQL insert compiler): the type without its size.
            db_type = field.db_type(connection).split("(")[0]
            if index in shared_places:
                self.scalars.append((index, preparers[index]))
                selected.append(f"(%s)::{db_type}")
            else:
                self.arrays.append((index, preparers[index]))
                selected.append(f"r.c{len(unnested)}")
                unnested.append(f"(%s)::{db_type}[]")
        if not unnested:
            raise ValueError(f"{new.model._meta.label}: no column differs from row to row")
        names = ", ".join(f"c{number}" for number in range(len(unnested)))
        self.sql = (f"{plan.into} SELECT {', '.join(selected)} FROM UNNEST({', '.join(unnested)}) AS r({names})"
                    f"{plan.returning_sql}")

