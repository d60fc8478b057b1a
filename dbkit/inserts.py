"""One row's INSERT, built by Django's compiler once per connection and then reused.

A row written on a hot path (an API submit's job, an answer's ledger row) went through
`Model.save` or the compiler every time: the compiler's pass over the fields cost more CPU than
the statement took in PostgreSQL (a twentieth of the web process's CPU per `POST /api/jobs/`; a
fifth of an answer's, with its question's UPDATE; bench/README.md, "The API's submit" and "An
answer's writes in one statement"). `kept_insert` has the compiler build a model's
`INSERT … RETURNING` once per connection for the columns written, and works out only each row's
values, as the compiler does (each field's `pre_save`, then its `get_db_prep_save`, through
the field's kept preparer: `dbkit.values.save_preparer`). Under
`check` (the test settings), the compiler builds it each time as well, and the two must agree.

`returned_into` puts what the statement returned into the instance, through the columns'
converters, as `Model.save` does, and marks it saved.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model
from django.db.models.sql import InsertQuery

from dbkit.instances import column_converters, converted
from dbkit.per_connection import once_per_connection
from dbkit.values import comparable, save_preparer


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
