"""dbkit.inserts.NewRow: a new row's INSERT kept per connection, the columns nobody gives written
into its text, the instance built without `Model.__init__`, and what it cannot write refused."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
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
    assert one.input == {} and one.input is not two.input
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


# Many rows at once: `NewRow.insert_many`.

JOB_GIVEN = ("kind", "input", "owner_id", "max_attempts")


def written_many(new: NewRow, shared: dict, each: tuple, rows: list, *, check: bool = True):
    """The rows written by `new`'s batch statement and their instances, marked saved as the caller does."""
    connection = connections["default"]
    sql, params, instances, returning = new.insert_many(connection, "default", shared, each, rows, check=check)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = {row[0]: row for row in cursor.fetchall()}
    for instance in instances:
        returned_into(instance, returning, returned[instance.pk], connection, "default")
    return sql, params, instances


def test_a_batchs_rows_are_what_bulk_create_writes_for_the_same_values():
    owner = get_user_model().objects.create_user("batch-owner")
    inputs = [{}, {"n": 1, "text": "it's \"quoted\" %s", "nested": [1, {"a": None}]}, {"ü": "é"}, {}]
    new = NewRow(Job, given=JOB_GIVEN)
    _, _, ours = written_many(new, {"kind": "demo.sleep", "owner_id": owner.pk, "max_attempts": 7}, ("input",),
                              [(value,) for value in inputs])
    theirs = Job.objects.bulk_create([Job(kind="demo.sleep", owner_id=owner.pk, max_attempts=7, input=value)
                                      for value in inputs])
    assert [job.input for job in ours] == inputs  # in the rows' order
    assert len({job.pk for job in ours}) == len(inputs)
    for one, other in zip(ours, theirs, strict=True):
        stored, expected = Job.objects.get(pk=one.pk), Job.objects.get(pk=other.pk)
        for field in Job._meta.concrete_fields:
            if field.attname in ("id", "created_at", "updated_at"):
                continue
            assert getattr(stored, field.attname) == getattr(expected, field.attname), field.attname
            assert getattr(one, field.attname) == getattr(stored, field.attname), field.attname
        assert one.created_at == stored.created_at and one.updated_at == stored.updated_at
        assert not one._state.adding


def test_a_batch_sends_an_array_only_for_what_differs_from_row_to_row():
    new = NewRow(Job, given=JOB_GIVEN)
    shared = {"kind": "demo.noop", "owner_id": None, "max_attempts": 3}
    sql, params, jobs = written_many(new, shared, ("input",), [({"a": index},) for index in range(5)])
    # The three shared values (in the columns' order), then the id's, the input's and the time's
    # arrays (nothing else).
    assert params[:3] == ["demo.noop", 3, None] and [len(array) for array in params[3:]] == [5, 5, 5]
    assert "UNNEST(" in sql and "'pending'" in sql
    again, _, _ = written_many(new, shared, ("input",), [({},)], check=False)
    assert again is sql  # kept for these names on this connection
    other, other_params, _ = written_many(new, {"owner_id": None, "max_attempts": 3}, ("kind", "input"),
                                          [("demo.noop", {}), ("demo.sleep", {})])
    assert other != sql and [len(array) for array in other_params[2:]] == [2, 2, 2, 2]
    assert Job.objects.filter(pk__in=[job.pk for job in jobs], kind="demo.noop", max_attempts=3).count() == 5


def test_each_row_of_a_batch_has_its_own_key_and_its_own_mutable_defaults():
    _, _, jobs = written_many(NewRow(Job, given=("kind",)), {}, ("kind",), [("demo.noop",), ("demo.noop",)])
    one, two = jobs
    assert one.pk != two.pk and one.input is not two.input
    one.input["changed"] = True
    assert two.input == {} and Job.objects.get(pk=two.pk).input == {}


@pytest.mark.parametrize(("shared", "each", "message"), [
    ({"kind": "demo.noop"}, ("input",), "shared: kind; each: input"),  # owner_id, max_attempts: neither
    ({"kind": "demo.noop", "input": {}, "owner_id": None}, ("input", "max_attempts"), "input"),  # input: both
    ({"kind": "x", "owner_id": None, "max_attempts": 1, "worker": ""}, ("input",), "worker"),  # not given
    ({"kind": "x", "owner_id": None}, ("input", "max_attempts", "input"), "each: input, max_attempts, input"),
])
def test_a_batch_whose_names_do_not_split_the_given_fields_is_refused(shared, each, message):
    with pytest.raises(ValueError, match="each given field .* is to be either shared or in each row, once") as caught:
        NewRow(Job, given=JOB_GIVEN).insert_many(connections["default"], "default", shared, each, [])
    assert message in str(caught.value)


def test_a_batch_with_nothing_that_differs_from_row_to_row_is_refused():
    with pytest.raises(ValueError, match="auth.Group: no column differs from row to row"):
        NewRow(Group, given=("name",)).insert_many(connections["default"], "default", {"name": "one"}, (), [(), ()])


def test_what_the_compiler_would_not_write_in_a_batch_is_caught_under_check(monkeypatch):
    new = NewRow(Job, given=("kind",))
    connection = connections["default"]
    new.insert_many(connection, "default", {}, ("kind",), [("demo.noop",)])
    plan = connection.__dict__[new._key]
    monkeypatch.setattr(plan, "row", [("wrong" if name == "worker" else value)
                                      for name, value in zip(plan.attnames, plan.row, strict=True)])
    with pytest.raises(AssertionError, match="worker is 'wrong', Model.__init__ made ''"):
        new.insert_many(connection, "default", {}, ("kind",), [("demo.noop",)], check=True)


def test_a_plan_is_never_one_left_on_the_connection_by_an_earlier_new_row():
    # An earlier `NewRow` gone, a new one may take its `id()`: it must not take its plan too.
    for status in ("pending", "waiting", "paused") * 4:
        _, _, job = written(NewRow(Job, given=("kind",), fixed={"status": status}), ["demo.noop"])
        assert job.status == status
