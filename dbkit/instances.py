"""A model instance from a row already read, without `Model.__init__`.

`Model.from_db` builds each instance through `Model.__init__`, which sets every field through
its descriptor, one `setattr` at a time, and sends `pre_init` and `post_init`. For a row that
holds the concrete fields in the model's order (all of them, or some: the others are deferred),
the result is the same instance as filling its `__dict__` at once: a field's descriptor keeps
the value under the field's `attname` in `__dict__` (a foreign key's `__set__` also clears a
cached related object, which a new instance does not have). On the platform's hot path (the
job's row every move returns, and its event's) that saved about 2 % of a no-op job's instructions
(bench/README.md, "A job's moves").

When a receiver listens to `pre_init` or `post_init` for the model, `from_db` is used as before:
such a receiver expects to run.

Decoded when read. A JSON column's value comes as text and is decoded by the field's converter
into Python; a row that a move reads back holds the job's input, its checkpoint and its result
whole, which the mover seldom reads (a progress report's row is not read at all). With an input
of 860 kB, the decoding made each of a job's events cost 15-20 ms of the worker's CPU, against
0.2 ms with an empty one (bench/README.md, "A process's start, and big JSON"). A field made with
`JSONDecodedWhenRead` keeps its column's text in the instance, decoded at the field's first read,
once: the instance and its value are what they would be otherwise, only later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import JSONField, Model
from django.db.models.base import ModelState
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

from dbkit.per_connection import once_per_connection


def column_converters(connection: Any, field: Any) -> list:
    """The converters of `field`'s column on `connection`, worked out once per connection (they
    are the backend's and the field's, fixed for both)."""
    cache = once_per_connection(connection, "_dbkit_converters", dict)
    try:
        return cache[field]
    except KeyError:
        col = field.get_col(field.model._meta.db_table)
        found = cache[field] = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        return found


def converted(value: Any, field: Any, converters: Any, connection: Any) -> Any:
    """`value` as read from `field`'s column, through its `converters` (`column_converters`)."""
    for converter in converters:
        value = converter(value, field, connection)
    return value


# The instance's `__dict__` key of {attname: (the column's value, its decoder)}: the values not
# decoded yet. A field's value is either there or under its attname, never in both.
UNDECODED = "_undecoded"


def instance_from_row(model: type[Model], using: str, attnames: list[str], values: list,
                      undecoded: dict[str, tuple[Any, Callable[[Any], Any]]] | None = None) -> Model:
    """What `model.from_db(using, attnames, values)` returns, where `attnames` are the model's
    concrete fields' attribute names, in `_meta.concrete_fields` order: all of them, or some
    (a field left out is deferred, as `from_db` leaves it: loaded from the database when read).

    `undecoded`: {attname: (the column's value, its decoder)} of fields made with
    `JSONDecodedWhenRead`, decoded at their first read (their places in `values` are not read)."""
    # No receiver at all (the usual case) is what `Signal.send` itself checks first.
    if ((pre_init.receivers or post_init.receivers)
            and (pre_init.has_listeners(model) or post_init.has_listeners(model))):
        if undecoded:  # `Model.__init__`'s receivers see the values themselves
            values = [undecoded[name][1](undecoded[name][0]) if name in undecoded else value
                      for name, value in zip(attnames, values, strict=True)]
        return model.from_db(using, attnames, values)
    instance = model.__new__(model)
    held = instance.__dict__
    held.update(zip(attnames, values, strict=True))
    if undecoded:
        for name in undecoded:
            del held[name]
        held[UNDECODED] = undecoded
    state = instance._state = ModelState()
    state.adding = False
    state.db = using
    return instance


class _DecodedWhenRead(DeferredAttribute):
    """A field's value on an instance: decoded from the column's value kept by
    `instance_from_row` at its first read; otherwise Django's (a field left out of a query's
    columns is loaded from the database when read). A value set, or once decoded, is in the
    instance's `__dict__`, where Python finds it before this descriptor."""

    def __get__(self, instance: Any, cls: Any = None) -> Any:
        if instance is not None:
            held = instance.__dict__
            name = self.field.attname
            undecoded = held.get(UNDECODED)
            if undecoded is not None and name in undecoded and name not in held:
                value, decode = undecoded[name]
                held[name] = decode(value)
                # A new dict, not the old one changed: a copy of the instance (`copy.copy`
                # shares its `__dict__`'s values) keeps the values it has not decoded yet.
                held[UNDECODED] = {other: kept for other, kept in undecoded.items() if other != name}
                return held[name]
        return super().__get__(instance, cls)


class JSONDecodedWhenRead(JSONField):
    """A `JSONField` whose value, in an instance made by `instance_from_row` with it among the
    undecoded ones, is decoded at its first read. Everywhere else it is Django's own, and its
    migrations name Django's field: what is stored and how are the same."""

    descriptor_class = _DecodedWhenRead

    def deconstruct(self) -> tuple:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class DecodedWhenReadModel(Model):
    """A model with `JSONDecodedWhenRead` fields: `refresh_from_db` reloads from the database
    what it would for an instance whose values were all decoded (all of them, or `fields`), so
    none of them is read later from the row the instance was made from."""

    class Meta:
        abstract = True

    def refresh_from_db(self, using: str | None = None, fields: Any = None, from_queryset: Any = None) -> None:
        undecoded = self.__dict__.pop(UNDECODED, None)
        if undecoded:
            if fields is None:
                # Whole, as it would be: then every field is reloaded (an absent one would stay
                # deferred). If the row is gone, the instance keeps the values it had.
                for name, (value, decode) in undecoded.items():
                    self.__dict__[name] = decode(value)
            else:
                fields = list(fields)
                kept = {name: pair for name, pair in undecoded.items() if name not in fields}
                if kept:
                    self.__dict__[UNDECODED] = kept
        super().refresh_from_db(using=using, fields=fields, from_queryset=from_queryset)
