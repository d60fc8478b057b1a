"""No index is another's leading columns: PostgreSQL finds rows by the first columns of a
composite index as well as by an index of those columns alone, and every index is one more
entry written at each insert (and at each update that moves the row: a job's every move). A
`ForeignKey` gets an index of its own from Django unless `db_index=False`; where a composite
index or unique constraint starts with that column, the field's own index was only a cost."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="read from PostgreSQL's catalog"),
    pytest.mark.django_db,
]

PROJECT_APPS = {"accounts", "approvals", "jobs", "ops", "waits", "webhooks"}

# Every index of a table: its name, its key columns in order, unique or not, partial or not.
INDEXES = """
SELECT i.relname, ARRAY(SELECT a.attname FROM unnest(x.indkey[0:x.indnkeyatts - 1]) WITH ORDINALITY k(n, o)
                        JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.n ORDER BY k.o),
       x.indisunique, x.indpred IS NOT NULL
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am am ON am.oid = i.relam
WHERE x.indrelid = %s::regclass AND am.amname = 'btree'
"""


def redundant_indexes(table: str) -> list[str]:
    """The indexes of `table` whose columns lead another index that covers every row (one not
    partial): each a plain index, not a unique one (whose uniqueness is a rule of its own)."""
    with connection.cursor() as cursor:
        cursor.execute(INDEXES, [table])
        indexes = cursor.fetchall()
    found = []
    for name, columns, unique, _ in indexes:
        for other, other_columns, _, partial in indexes:
            if (other != name and not unique and not partial and len(columns) < len(other_columns)
                    and list(other_columns[:len(columns)]) == list(columns)):
                found.append(f"{table}.{name} {list(columns)} leads {other} {list(other_columns)}")
    return found


def test_no_index_of_the_platforms_tables_is_the_start_of_another():
    tables = sorted({model._meta.db_table for model in apps.get_models() if model._meta.app_label in PROJECT_APPS
                     and model._meta.managed and not model._meta.proxy})
    assert "jobs_jobevent" in tables and "approvals_decision" in tables
    assert [found for table in tables for found in redundant_indexes(table)] == []


def test_an_index_that_another_starts_with_is_found():
    """The check is not vacuous: an index of `job_id` alone beside the events' (job_id, seq)."""
    with connection.cursor() as cursor:
        cursor.execute('CREATE INDEX test_events_job_alone ON "jobs_jobevent" ("job_id")')
    found = redundant_indexes("jobs_jobevent")
    assert found == ["jobs_jobevent.test_events_job_alone ['job_id'] leads jobevent_unique_seq ['job_id', 'seq']"]


def test_dropping_such_an_index_leaves_the_foreign_key_alone():
    """Django's own AlterField drops the foreign key's constraint with its index and adds it
    again, and PostgreSQL then checks every row under a lock that stops the table's writes; the
    migrations that dropped these indexes touch the index alone (`dbkit.schema`), concurrently."""
    from io import StringIO

    from django.core.management import call_command

    for app, migration in (("jobs", "0008"), ("approvals", "0007"), ("waits", "0004"), ("webhooks", "0004")):
        out = StringIO()
        call_command("sqlmigrate", app, migration, backwards=True, stdout=out)
        sql = out.getvalue()
        assert "CREATE INDEX CONCURRENTLY" in sql and "CONSTRAINT" not in sql, sql
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "jobs_jobevent")
    assert any(info["foreign_key"] == ("jobs_job", "id") and info["columns"] == ["job_id"]
               for info in constraints.values())
