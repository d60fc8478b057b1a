"""dbkit.inserts.NewRow: a new row's INSERT kept per connection, the columns nobody gives written
into its text, the instance built without `Model.__init__`, and what it cannot write refused."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest
from django.db import connections
from django.db.models import CharField

from dbkit.inserts import NewRow, returned_into
from jobs.models import Job, JobEvent

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connections["default"].vendor != "postgresql", reason="NewRow's statements are PostgreSQL's"),
]


def written(new: NewRow, values: list, *, check: bool = True):
    """The row written by `new`'s statement and its instance, marked saved as the caller does."""
    connection = connections["default"]
    sql, params, instance, returning = new.insert(connection, "default", values, check=check)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned_into(instance, returning, cursor.fetchone(), connection, "default")
    return sql, params, instance


def test_a_row_with_an_auto_key_and_an_auto_now_add_time_is_the_compilers_and_the_databases():
    job = Job.objects.create(kind="demo.noop")
    new = NewRow(JobEvent, given=("job_id", "seq", "type", "message"))
    sql, params, event = written(new, [job.pk, 7, "step", {"a": 1}])  # checked against the compiler
    stored = JobEvent.objects.get(pk=event.pk)
    for field in JobEvent._meta.concrete_fields:
        assert getattr(event, field.attname) == getattr(stored, field.attname), field.attname
    assert (stored.step, stored.status) == ("", "")  # the defaults, written into the text
    assert "''" in sql and '"id"' not in sql.split("RETURNING")[0]  # the key is the database's
    assert len(params) == 5  # the four given and the time, made for this row


def test_each_row_has_its_own_mutable_default_and_its_own_fresh_values():
    new = NewRow(Job, given=("kind",))
    _, _, one = written(new, ["demo.noop"])
    sql, _, two = written(new, ["demo.noop"])
    assert one.pk != two.pk and isinstance(one.pk, uuid.UUID)
    assert one.input == {} and one.input is not two.input and one.checkpoint is not two.checkpoint
    one.input["changed"] = True
    assert two.input == {} and Job.objects.get(pk=two.pk).input == {}
    assert two.created_at >= one.created_at and two.updated_at is not None
    assert "'pending'" in sql and "'{}'::jsonb" in sql  # the constants: a literal each, no parameter
    text, *_ = written(new, ["demo.sleep"], check=False)
    assert text is sql  # the same string on this connection


def test_a_fixed_value_is_written_into_the_text():
    new = NewRow(Job, given=("kind",), fixed={"event_seq": 4, "status": "waiting"})
    sql, params, job = written(new, ["demo.noop"])
    assert (job.event_seq, job.status) == (4, "waiting") and "'waiting'" in sql and 4 not in params
    assert Job.objects.filter(pk=job.pk, event_seq=4, status="waiting").exists()


def test_a_field_it_does_not_know_is_refused_by_name():
    with pytest.raises(ValueError, match="has no concrete field nonsense, owner"):
        NewRow(Job, given=("kind", "owner"), fixed={"nonsense": 1}).insert(connections["default"], "default", [1, 2])


def test_a_field_prepared_by_its_own_pre_save_is_refused_unless_given():
    with mock.patch.object(CharField, "pre_save", lambda self, instance, add: "made"):
        with pytest.raises(TypeError, match="jobs.JobEvent.type is prepared by its own pre_save: give it"):
            NewRow(JobEvent, given=("job_id",)).insert(connections["default"], "default", [None])


def test_what_the_compiler_would_not_write_is_caught_under_check(monkeypatch):
    new = NewRow(Job, given=("kind",))
    connection = connections["default"]
    new.insert(connection, "default", ["demo.noop"])
    plan = connection.__dict__[new._key]
    monkeypatch.setattr(plan, "row", [("wrong" if name == "worker" else value)
                                      for name, value in zip(plan.attnames, plan.row, strict=True)])
    with pytest.raises(AssertionError, match="worker is 'wrong', Model.__init__ made ''"):
        new.insert(connection, "default", ["demo.noop"], check=True)
