"""dbkit.instances: an instance filled from a whole row is the one `Model.from_db` builds."""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.db.models.signals import post_init

from dbkit.instances import instance_from_row
from jobs.events import _EVENT_ATTNAMES
from jobs.models import Job, JobEvent


def _row(model) -> tuple[list[str], list]:
    now = datetime.datetime(2026, 12, 4, 10, 0, tzinfo=datetime.UTC)
    samples = {"id": uuid.uuid4(), "owner_id": 7, "parent_id": uuid.uuid4(), "created_at": now, "updated_at": now}
    attnames = [field.attname for field in model._meta.concrete_fields]
    values = [samples.get(name, f"value of {name}") for name in attnames]
    return attnames, values


def _seen(instance) -> dict:
    return {key: value for key, value in vars(instance).items() if key != "_state"}


@pytest.mark.parametrize("model", [Job, JobEvent])
def test_the_instance_is_from_dbs_with_its_state(model):
    attnames, values = _row(model)
    expected = model.from_db("default", attnames, values)
    made = instance_from_row(model, "default", attnames, values)
    assert type(made) is model
    assert _seen(made) == _seen(expected)
    assert (made._state.adding, made._state.db) == (False, "default")
    assert made.pk == values[0]
    assert made == expected  # the same row


def test_a_foreign_key_set_later_still_clears_its_cached_object():
    attnames, values = _row(Job)
    job = instance_from_row(Job, "default", attnames, values)
    job._state.fields_cache["owner"] = object()
    job.owner_id = 8  # the descriptor still guards the attribute
    assert "owner" not in job._state.fields_cache


def test_a_model_with_init_receivers_is_built_by_from_db_so_they_run():
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=JobEvent)
    try:
        attnames, values = _row(JobEvent)
        made = instance_from_row(JobEvent, "default", attnames, values)
    finally:
        post_init.disconnect(receiver, sender=JobEvent)
    assert seen == [made]


def test_a_row_without_every_field_is_from_dbs_deferred_instance():
    attnames, values = _row(Job)
    made = instance_from_row(Job, "default", attnames[:3], values[:3])
    assert made.get_deferred_fields() == set(attnames[3:])


def test_a_moves_event_row_names_every_column_of_the_event_in_order():
    assert _EVENT_ATTNAMES == [field.attname for field in JobEvent._meta.concrete_fields]


@pytest.mark.django_db
def test_a_batchs_first_events_are_made_without_model_init_and_saved_whole(monkeypatch):
    from unittest import mock

    from django.db import connection

    from jobs.services import jobs_submit_many

    if connection.vendor != "postgresql":
        pytest.skip("the one-statement submit is PostgreSQL's")
    monkeypatch.setattr("jobs.services.transitions.jobs_dispatch", lambda jobs: None)
    with mock.patch.object(JobEvent, "__init__", side_effect=AssertionError("Model.__init__ for an event")):
        jobs = jobs_submit_many(kind="demo.noop", inputs=[{}] * 3)
    stored = JobEvent.objects.filter(job__in=jobs).order_by("job_id")
    assert [(e.seq, e.type, e.step, e.status, e.message) for e in stored] == [(1, "status", "", "pending", {})] * 3
    assert {e.job_id for e in stored} == {job.pk for job in jobs}


# -- JSON decoded when read --------------------------------------------------------------------
BIG = {"rows": [{"id": index, "name": f"item {index}"} for index in range(2000)]}


def _moved_job(input):
    """A job claimed, with `input` stored, and the `Job` its claim read back."""
    from unittest import mock

    from jobs.services import job_claim, job_submit

    with mock.patch("jobs.services.transitions.job_dispatch"):
        job, _ = job_submit(kind="demo.noop", input={})
    Job.objects.filter(pk=job.pk).update(input=input, error={"a": 1})
    return job_claim(job_id=job.pk, worker="w", task_id="t")


@pytest.mark.django_db
def test_a_moves_row_keeps_its_json_undecoded_until_read_and_then_is_the_querysets(django_assert_num_queries):
    claimed = _moved_job(BIG)
    assert {"input", "error"} <= set(claimed.__dict__["_undecoded"])
    assert "input" not in claimed.__dict__ and "error" not in claimed.__dict__
    with django_assert_num_queries(0):  # decoded from the row, not loaded again
        assert claimed.input == BIG and claimed.error == {"a": 1}
    assert claimed.input is claimed.input  # decoded once
    assert "input" not in claimed.__dict__["_undecoded"]
    stored = Job.objects.get(pk=claimed.pk)
    assert {field.attname: getattr(claimed, field.attname) for field in Job._meta.concrete_fields} == \
        {field.attname: getattr(stored, field.attname) for field in Job._meta.concrete_fields}
    assert claimed.result is None  # a NULL column needs no decoding: it was converted at once


@pytest.mark.django_db
def test_an_event_of_a_job_with_a_big_input_decodes_none_of_it():
    """A progress report, a log line, a step: each move reads the job's row back, its input
    whole. With an input of 860 kB that decoding made each event cost 15-20 ms of the worker's
    CPU (bench/README.md, "A process's start, and big JSON")."""
    import json
    from unittest import mock

    from jobs.events import event_append

    claimed = _moved_job(BIG)
    with mock.patch("django.db.models.fields.json.json.loads", wraps=json.loads) as loads:
        for index in range(3):
            event_append(job_id=claimed.pk, type="log", message={"text": f"line {index}"},
                         run_attempt=claimed.attempts)
    assert [call for call in loads.call_args_list if len(call.args[0]) > 1000] == []


@pytest.mark.django_db
def test_a_step_reads_back_its_own_result_alone_and_the_first_stored_wins():
    """A step writes its own row and reads back its stored result alone: with the checkpoint at
    1.1 MB, reading it back and decoding it whole made a step of 10 kB cost some 27 ms of the
    worker's CPU (bench/README.md, "A step's result read back alone"). The first stored result
    still wins, and the job's checkpoint lists its steps in the order they finished."""
    import json
    from unittest import mock

    from jobs.events import step_checkpoint

    claimed = _moved_job(BIG)
    step_checkpoint(job_id=claimed.pk, run_attempt=claimed.attempts, step="big", value=BIG)
    with mock.patch("django.db.models.fields.json.json.loads", wraps=json.loads) as loads:
        assert step_checkpoint(job_id=claimed.pk, run_attempt=claimed.attempts, step="small",
                               value={"n": [1, 2]}) == {"n": [1, 2]}
        assert step_checkpoint(job_id=claimed.pk, run_attempt=claimed.attempts, step="small",
                               value={"n": 99}) == {"n": [1, 2]}
        assert step_checkpoint(job_id=claimed.pk, run_attempt=claimed.attempts, step="none", value=None) is None
    assert [call for call in loads.call_args_list if len(call.args[0]) > 1000] == []
    stored = Job.objects.get(pk=claimed.pk).checkpoint
    assert stored == {"big": BIG, "small": {"n": [1, 2]}, "none": None}
    assert list(stored) == ["big", "small", "none"]  # in the order they finished


@pytest.mark.django_db
def test_a_refresh_reads_the_database_not_the_rows_undecoded_values():
    claimed = _moved_job({"v": 1})
    Job.objects.filter(pk=claimed.pk).update(input={"v": 2}, error={"b": 2})
    claimed.refresh_from_db(fields=["input"])
    assert claimed.input == {"v": 2}
    assert claimed.error == {"a": 1}  # not refreshed: the row's, as any field not named
    claimed = _moved_job({"v": 1})
    Job.objects.filter(pk=claimed.pk).update(input={"v": 3}, error={"c": 3})
    claimed.refresh_from_db()
    assert "_undecoded" not in claimed.__dict__
    assert (claimed.input, claimed.error) == ({"v": 3}, {"c": 3})
    assert claimed.get_deferred_fields() == set()


@pytest.mark.django_db
def test_a_copy_and_its_original_each_decode_their_own():
    import copy

    claimed = _moved_job({"v": 1})
    twin = copy.copy(claimed)
    assert claimed.input == {"v": 1}
    assert twin.input == {"v": 1} and twin.error == {"a": 1} and claimed.error == {"a": 1}


@pytest.mark.django_db
def test_init_receivers_see_decoded_values():
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.__dict__.get("input"))

    post_init.connect(receiver, sender=Job)
    try:
        claimed = _moved_job({"v": 1})
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert seen[-1] == {"v": 1} and claimed.input == {"v": 1}


@pytest.mark.django_db
def test_a_moved_job_saved_again_keeps_its_undecoded_values():
    claimed = _moved_job({"v": 1})
    claimed.progress_text = "saved"
    claimed.save()
    stored = Job.objects.get(pk=claimed.pk)
    assert (stored.progress_text, stored.input, stored.error) == ("saved", {"v": 1}, {"a": 1})


def test_the_fields_migrations_name_djangos_json_field():
    from dbkit.instances import JSONDecodedWhenRead

    assert JSONDecodedWhenRead(null=True).deconstruct()[1] == "django.db.models.JSONField"


@pytest.mark.django_db
def test_an_events_move_does_not_read_the_jobs_json_back():
    """A progress report, a log line, a step's start: their callers read the event, not the job,
    so the database does not send the job's input and result back at each one; the job's JSON
    fields are deferred (loaded if read) and the rest is there."""
    from unittest import mock

    from dbkit.prepared import prepared_fetch
    from jobs.events import event_append, step_begin

    if connection_vendor() != "postgresql":
        pytest.skip("the move and its event are one statement on PostgreSQL")
    claimed = _moved_job(BIG)
    sent, jobs = [], []

    def spy(conn, sql, params, **kwargs):
        sent.append(sql)
        return prepared_fetch(conn, sql, params, **kwargs)

    real = __import__("jobs.models", fromlist=["job_from_row"]).job_from_row

    def keep(*args, **kwargs):
        jobs.append(real(*args, **kwargs))
        return jobs[-1]

    with mock.patch("jobs.models.prepared_fetch", spy), mock.patch("jobs.models.job_from_row", keep):
        event = event_append(job_id=claimed.pk, type="progress", message={"fraction": 0.5, "text": ""},
                             fields={"progress_fraction": 0.5}, run_attempt=claimed.attempts)
        step_begin(job_id=claimed.pk, run_attempt=claimed.attempts, step="s")
    assert len(sent) == 2 and event.seq == claimed.event_seq + 1
    for sql in sent:
        returning = sql.split("RETURNING", 1)[1]
        assert '"input"' not in returning and '"result"' not in returning and '"event_seq"' in returning
    job = jobs[0]
    assert job.get_deferred_fields() == {"input", "result", "error", "gathering"}
    assert (job.progress_fraction, job.status) == (0.5, Job.Status.PROCESSING)
    assert job.input == BIG  # a deferred field: loaded when read


def connection_vendor() -> str:
    from django.db import connection

    return connection.vendor
