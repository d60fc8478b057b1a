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
