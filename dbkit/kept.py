"""A read of a fixed shape, built by the ORM once per connection and then reused.

Some reads run on every request or every job: an API request's token lookup, a finished job's
look for its owner's webhooks. Building such a statement through the ORM (the queryset, its
joins, compiling) costs more CPU than sending it to the database. `KeptRead` has the ORM build it
once per connection with a stand-in value, keeps the text with the place of that value in its
parameters, and runs it with each read's own value. The rows become model instances through the
same compiler, converters and `select_related` populators a queryset uses, so what a caller gets
is what the queryset would have given.

Only a queryset whose one varying value is a plain parameter of its statement fits: the stand-in
must appear exactly once among the parameters, as given (a string or an integer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators


@dataclass(frozen=True)
class _Built:
    sql: str
    params: tuple
    slot: int
    compiler: Any
    init_list: list[str]
    fields: slice
    populators: list


class KeptRead:
    """`build(value)` is the queryset (of one model, maybe with `select_related`) for one value;
    `stand_in` is the value it is built with once per connection."""

    def __init__(self, build: Callable[[Any], QuerySet], *, stand_in: str | int) -> None:
        self.build = build
        self.stand_in = stand_in
        self._key = f"_dbkit_kept_{id(self)}"

    def _built(self, connection: Any) -> _Built:
        built = connection.__dict__.get(self._key)
        if built is None:
            queryset = self.build(self.stand_in).using(connection.alias)
            compiler = queryset.query.get_compiler(connection=connection)
            sql, params = compiler.as_sql()
            if list(params).count(self.stand_in) != 1:
                raise ValueError(f"KeptRead: the stand-in {self.stand_in!r} must be one parameter of {sql!r} "
                                 f"exactly once; it is not, with {params!r}")
            klass_info, select = compiler.klass_info, compiler.select
            fields = slice(klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1)
            built = connection.__dict__[self._key] = _Built(
                sql=sql, params=tuple(params), slot=list(params).index(self.stand_in), compiler=compiler,
                init_list=[column[0].target.attname for column in select[fields]], fields=fields,
                populators=get_related_populators(klass_info, select, connection.alias))
        return built

    def rows(self, value: str | int, *, using: str) -> list[Model]:
        """The instances the queryset built for `value` would give, in its order (one statement)."""
        connection = connections[using]
        built = self._built(connection)
        params = list(built.params)
        params[built.slot] = value
        with connection.cursor() as cursor:
            cursor.execute(built.sql, params)
            fetched = cursor.fetchall()
        model = built.compiler.klass_info["model"]
        found = []
        for row in built.compiler.results_iter(results=[fetched]):
            instance = model.from_db(using, built.init_list, row[built.fields])
            for populator in built.populators:
                populator.populate(row, instance)
            found.append(instance)
        return found
