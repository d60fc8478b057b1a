"""A value as a field's `get_db_prep_save` makes it, without the field's chain of methods for the
plain values of the common fields.

`Field.get_db_prep_save` goes through `get_db_prep_value`, `get_prep_value` and `to_python` for
every value, each asking what the value is (an expression? a lazy string?), to give back, for a
`str` in a `CharField` or an aware `datetime` in a `DateTimeField` on PostgreSQL, the value itself.
A no-op job's two moves prepared 18 values that way (bench/README.md, "Values prepared"). A
preparer answers those cases from the value's exact type and leaves every other value (an
expression, a subclass, a naive time, another field's class) to the field's own method.
`lookup_preparer` does the same for the value an `exact` lookup sends (a kept move's WHERE: the
job's id, what it is suspended on).

`prepared_checked` prepares a value both ways, and the two must agree: the callers use it under the
test settings (`JOBS_CHECK_MOVE_STATEMENTS`), so the whole suite checks the preparers.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from typing import Any

from django.db.models import (
    BigIntegerField,
    CharField,
    DateTimeField,
    IntegerField,
    JSONField,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallIntegerField,
    TextField,
    UUIDField,
)

Preparer = Callable[[Any, Any], Any]


def save_preparer(field: Any, connection: Any) -> Preparer:
    """`prepare(value, connection)`, which returns what `field.get_db_prep_save(value, connection)`
    returns, for a connection of the same backend as `connection`. Make it once and keep it."""
    slow = field.get_db_prep_save
    kind = type(field)
    if kind is CharField or kind is TextField:
        # `to_python` gives a `str` back as it is, and the base `get_db_prep_value` adds nothing.
        return lambda value, connection: value if type(value) is str else slow(value, connection)
    if kind is DateTimeField and _times_go_as_they_are(connection):
        # An aware time: `get_prep_value` neither converts nor warns, and the backend sends it as is.
        return lambda value, connection: (value if type(value) is datetime.datetime and value.tzinfo is not None
                                          else slow(value, connection))
    if kind in INTEGER_FIELDS:
        return _integer_preparer(field, connection, slow)
    if kind is JSONField:
        encoder = field.encoder
        return lambda value, connection: (connection.ops.adapt_json_value(value, encoder)
                                          if type(value) is dict or type(value) is list else slow(value, connection))
    return slow


def lookup_preparer(field: Any, connection: Any) -> Preparer:
    """`prepare(value, connection)`, which returns what an `exact` lookup on `field` sends for
    `value` (`field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)`),
    for a connection of the same backend as `connection`. Make it once and keep it."""
    def slow(value: Any, connection: Any) -> Any:
        return field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)

    kind = type(field)
    if kind is CharField or kind is TextField:
        return lambda value, connection: value if type(value) is str else slow(value, connection)
    if kind is UUIDField and connection.features.has_native_uuid_field:
        # A `UUID` is its own prepared value where the backend stores UUIDs natively (PostgreSQL).
        return lambda value, connection: value if type(value) is uuid.UUID else slow(value, connection)
    if kind in INTEGER_FIELDS:
        return _integer_preparer(field, connection, slow)
    return slow


# The integer fields whose `get_prep_value` gives an `int` back as it is and whose
# `get_db_prep_value` adds only the backend's `adapt_integerfield_value` (not the auto fields:
# theirs checks the value too).
INTEGER_FIELDS = frozenset({IntegerField, SmallIntegerField, BigIntegerField, PositiveIntegerField,
                            PositiveSmallIntegerField, PositiveBigIntegerField})


def _integer_preparer(field: Any, connection: Any, slow: Preparer) -> Preparer:
    """An `int` (not a `bool`, not an expression) as the backend adapts it: on PostgreSQL with
    psycopg 3, wrapped in the type that names its column's size (`Int4`, ...); as it is where the
    backend adapts nothing. Anything else, or a backend that adapts otherwise, the field's way."""
    from django.db.backends.base.operations import BaseDatabaseOperations

    adapt = type(connection.ops).adapt_integerfield_value
    if adapt is BaseDatabaseOperations.adapt_integerfield_value:
        return lambda value, connection: value if type(value) is int else slow(value, connection)
    if connection.vendor == "postgresql":
        from django.db.backends.postgresql.operations import DatabaseOperations

        if adapt is DatabaseOperations.adapt_integerfield_value and hasattr(connection.ops, "integerfield_type_map"):
            wrap = connection.ops.integerfield_type_map[field.get_internal_type()]
            return lambda value, connection: wrap(value) if type(value) is int else slow(value, connection)
    return slow


def _times_go_as_they_are(connection: Any) -> bool:
    """Whether the backend's `adapt_datetimefield_value` is PostgreSQL's, which returns the time."""
    if connection.vendor != "postgresql":
        return False
    from django.db.backends.postgresql.operations import DatabaseOperations

    return type(connection.ops).adapt_datetimefield_value is DatabaseOperations.adapt_datetimefield_value


def prepared_checked(field: Any, prepare: Preparer, value: Any, connection: Any) -> Any:
    """`prepare(value, connection)`, which must give what `field.get_db_prep_save` gives."""
    fast, slow = prepare(value, connection), field.get_db_prep_save(value, connection)
    if _comparable(fast) != _comparable(slow):
        raise AssertionError(f"{field} prepared {value!r} as {fast!r}; get_db_prep_save gives {slow!r}")
    return fast


def comparable(param: Any) -> Any:
    """A statement's parameter as it compares: psycopg's adapters (Jsonb) compare by identity, so
    what they carry."""
    return (type(param).__name__, param.obj) if hasattr(param, "obj") else param


def _comparable(value: Any) -> Any:
    # A prepared value must also be of the same type (`1` and `True` compare equal).
    return type(value), comparable(value)


def sql_literal(param: Any, connection: Any) -> str:
    """A prepared parameter written as a literal, as psycopg writes it (Django's `compose_sql`:
    PostgreSQL only), for a text that still goes with other parameters: a `%` in it doubled."""
    return connection.ops.compose_sql("%s", [param]).replace("%", "%%")
