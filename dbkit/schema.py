"""Schema changes that Django's own operations make more costly than they need to be."""

from __future__ import annotations

from typing import Any

from django.db import migrations


class ForeignKeyIndexDropped(migrations.AlterField):
    """`AlterField` of a `ForeignKey` to `db_index=False`, where a composite index or a unique
    constraint starting with its column finds its rows already (tests/test_indexes.py).

    Django's own `AlterField` drops the foreign key's constraint with its index and adds it
    again, and PostgreSQL then checks every row of the table under a lock that stops its writes
    (a job's every move, on a table of every event ever written). On PostgreSQL this drops only
    the index, `CONCURRENTLY` (the migration is not atomic for it), and puts it back the same way
    when the migration is reversed. Elsewhere (SQLite remakes the table for any change) it is
    Django's `AlterField`."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        field = model._meta.get_field(self.name)
        named = {index.name for index in model._meta.indexes}
        with schema_editor.connection.cursor() as cursor:
            constraints = schema_editor.connection.introspection.get_constraints(cursor, model._meta.db_table)
        for name, info in constraints.items():
            if (info["index"] and info["columns"] == [field.column] and not info["unique"]
                    and not info["primary_key"] and name not in named):
                schema_editor.execute(schema_editor._delete_index_sql(model, name, concurrently=True))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        field = model._meta.get_field(self.name)
        schema_editor.execute(schema_editor._create_index_sql(model, fields=[field], concurrently=True))

    def describe(self) -> str:
        return f"Drop the index of {self.model_name}.{self.name} alone (a composite index starts with it)"
