"""A read of a fixed shape, built by the ORM once (per process, for every thread's connection:
`dbkit.per_connection`) and then reused.

Some reads run on every request or every job: an API request's token lookup, a finished job's
look for its owner's webhooks. Building such a statement through the ORM (the queryset, its
joins, compiling) costs more CPU than sending it to the database. `KeptRead` has the ORM build it
once per connection with a stand-in value, keeps the text with the place of that value in its
parameters, and runs it with each read's own value. The rows become model instances through the
same compiler, converters, `select_related` populators and annotations a queryset uses, so what a
caller gets is what the queryset would have given.

Only a queryset whose varying values are plain parameters of its statement fits: each stand-in
must appear among the parameters (as given, or for a UUID as the backend stores it: a `UUID` or
its hex), and no other parameter may equal it. A value may appear more than once (a user's id in
two subqueries); each place gets the read's own value. A stand-in has to be a value its field
takes: Django leaves out a condition no row can meet (a negative number for a positive field)
rather than sending it.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import ModelIterable, get_related_populators

from dbkit.per_connection import once_per_connection
from dbkit.prepared import prepared_fetch


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


# How a stand-in may appear among a statement's parameters, and how a read's value is put there.
_UUID_FORMS: list[Callable[[Any], Any]] = [
    _as_uuid, lambda value: _as_uuid(value).hex, lambda value: str(_as_uuid(value)),
]


def _places(params: list, stand_in: Any) -> tuple[list[int], Callable[[Any], Any]]:
    forms = _UUID_FORMS if isinstance(stand_in, uuid.UUID) else [lambda value: value]
    for form in forms:
        places = [index for index, param in enumerate(params) if param == form(stand_in)]
        if places:
            return places, form
    return [], forms[0]


_numbers = itertools.count()


@dataclass(frozen=True)
class _Built:
    sql: str
    params: tuple
    # For each value of a read: the places of its parameters, and how it is put there.
    slots: tuple[tuple[tuple[int, ...], Callable[[Any], Any]], ...]
    compiler: Any
    # The columns' converters (the compiler's `get_converters`): worked out with the text, not
    # for each read, where they were a tenth of an answer's reads.
    converters: dict | None
    # How a row becomes an instance of `model`; none of it for a `values_list` read, whose rows
    # are tuples.
    init_list: list[str] = dataclasses.field(default_factory=list)
    fields: slice = dataclasses.field(default_factory=lambda: slice(0))
    populators: list = dataclasses.field(default_factory=list)
    annotations: tuple[tuple[str, int], ...] = ()
    model: Any = None


class KeptRead:
    """`build(*values)` is the queryset for the read's values: of one model (maybe with
    `select_related` and annotations), or a `values_list` (maybe a union), whose rows come back as
    tuples. `stand_ins` are the values it is built with once per connection, one for each."""

    def __init__(self, build: Callable[..., QuerySet], *, stand_ins: tuple[Any, ...]) -> None:
        self.build = build
        self.stand_ins = stand_ins
        # Not id(self): a read that was freed (a test's) may leave its id to a new one.
        self._key = f"_dbkit_kept_{next(_numbers)}"

    def _built(self, connection: Any) -> _Built:
        return once_per_connection(connection, self._key, lambda: self._build(connection))

    def _build(self, connection: Any) -> _Built:
        queryset = self.build(*self.stand_ins).using(connection.alias)
        compiler = queryset.query.get_compiler(connection=connection)
        sql, params = compiler.as_sql()
        params = list(params)
        slots = [_places(params, stand_in) for stand_in in self.stand_ins]
        taken = [place for places, _ in slots for place in places]
        if any(not places for places, _ in slots) or len(taken) != len(set(taken)):
            raise ValueError(f"KeptRead: each stand-in of {self.stand_ins!r} must be a parameter of its own in "
                             f"{sql!r}; the parameters are {params!r}")
        slots = tuple((tuple(places), form) for places, form in slots)
        columns = [column[0] for column in compiler.select[:compiler.col_count]]
        # None: a composite primary key's columns, which `results_iter` makes tuples of.
        converters = None if compiler.has_composite_fields(columns) else compiler.get_converters(columns)
        if queryset._iterable_class is ModelIterable:
            klass_info, select = compiler.klass_info, compiler.select
            fields = slice(klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1)
            return _Built(sql=sql, params=tuple(params), slots=slots, compiler=compiler, converters=converters,
                          init_list=[column[0].target.attname for column in select[fields]], fields=fields,
                          populators=get_related_populators(klass_info, select, connection.alias),
                          annotations=tuple(compiler.annotation_col_map.items()), model=klass_info["model"])
        return _Built(sql=sql, params=tuple(params), slots=slots, compiler=compiler, converters=converters)

    def _check(self, values: tuple, connection: Any, sql: str, params: list, fetched: list) -> None:
        """Under the test settings (`KEPT_READS_CHECK`): the ORM builds each read too, and it must
        be the same statement with the same parameters."""
        try:
            expected_sql, expected_params = self.build(*values).using(connection.alias).query.get_compiler(
                connection=connection).as_sql()
        except EmptyResultSet:  # the ORM would not even ask: no row can match
            if fetched:
                raise AssertionError(f"a kept read found rows the ORM says none can match: {sql}\n{params}") from None
            return
        if sql != expected_sql or params != list(expected_params):
            raise AssertionError(f"a kept read differs from the ORM's:\n{sql}\n{params}\n"
                                 f"{expected_sql}\n{list(expected_params)}")

    def rows(self, *values: Any, using: str) -> list[Model] | list[tuple]:
        """The instances (or tuples) the queryset built for `values` would give, in its order (one
        statement)."""
        connection = connections[using]
        built = self._built(connection)
        params = list(built.params)
        for value, (places, form) in zip(values, built.slots, strict=True):
            for place in places:
                params[place] = form(value)
        fetched = prepared_fetch(connection, built.sql, params)
        if settings.KEPT_READS_CHECK:
            self._check(values, connection, built.sql, params, fetched)
        # What `results_iter` does with the rows, with the converters kept.
        if built.converters is None:
            converted = built.compiler.results_iter(results=[fetched])
        elif built.converters:
            converted = built.compiler.apply_converters(fetched, built.converters)
        else:
            converted = fetched
        if built.model is None:
            return [tuple(row) for row in converted]
        found = []
        for row in converted:
            instance = built.model.from_db(using, built.init_list, row[built.fields])
            for populator in built.populators:
                populator.populate(row, instance)
            for name, place in built.annotations:
                setattr(instance, name, row[place])
            found.append(instance)
        return found
