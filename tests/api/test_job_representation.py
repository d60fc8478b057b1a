"""The API's job (`JobSerializer`), built in one step, is what DRF's field-by-field pass gives,
for jobs of every shape (Hypothesis); a subclass, and an error that is not a non-empty object,
take DRF's pass."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from jobs.models import Job
from jobs.serializers import JobSerializer

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
times = st.none() | st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                                 timezones=st.just(UTC))
errors = st.none() | st.fixed_dictionaries(
    {},
    optional={
        "code": st.none() | st.text(max_size=10) | st.integers(),
        "message": st.text(max_size=30) | st.just("boom\n\nTraceback (most recent call last):\n  File x"),
        "traceback": st.text(max_size=10),
    },
).filter(bool)


@st.composite
def jobs(draw) -> Job:
    job = Job(
        id=draw(st.uuids()),
        kind=draw(st.text(min_size=1, max_size=20)),
        status=draw(st.sampled_from(Job.Status.values)),
        input=draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        result=draw(json_values),
        error=draw(errors),
        progress_fraction=draw(st.floats(min_value=0, max_value=1) | st.integers(min_value=0, max_value=1)),
        progress_text=draw(st.text(max_size=20)),
        attempts=draw(st.integers(min_value=0, max_value=10)),
        max_attempts=draw(st.integers(min_value=1, max_value=10)),
        idempotency_key=draw(st.none() | st.text(max_size=20)),
        parent_id=draw(st.none() | st.uuids()),
    )
    for name in ("created_at", "updated_at", "started_at", "finished_at"):
        setattr(job, name, draw(times))
    children = draw(st.lists(st.tuples(st.uuids(), times.filter(lambda t: t is not None)), max_size=3))
    job._prefetched_objects_cache = {"children": [Job(id=pk, created_at=at) for pk, at in children]}
    return job


def by_drf(job: Job) -> dict:
    """DRF's own pass over the serializer's fields."""
    return dict(serializers.ModelSerializer.to_representation(JobSerializer(job), job))


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_the_one_step_representation_is_drfs(job):
    ours = JobSerializer(job).data
    assert ours == by_drf(job)
    assert list(ours) == JobSerializer.Meta.fields


def test_a_subclass_and_an_error_that_is_not_an_object_take_drfs_pass():
    class Narrow(JobSerializer):
        class Meta(JobSerializer.Meta):
            fields = ["id", "status"]

    job = Job(id=uuid.uuid4(), kind="demo.noop", status="failed", error={"code": "x", "message": "m"},
              created_at=datetime(2026, 1, 1, tzinfo=UTC))
    job._prefetched_objects_cache = {"children": []}
    assert dict(Narrow(job).data) == {"id": str(job.pk), "status": "failed"}
    for malformed in ({}, "a string"):  # never written by the platform: DRF's pass, as it fails
        job.error = malformed
        with pytest.raises((KeyError, AttributeError)) as ours:
            JobSerializer(job).data  # noqa: B018
        with pytest.raises((KeyError, AttributeError)) as drfs:
            by_drf(job)
        assert type(ours.value) is type(drfs.value)


def test_a_job_does_not_go_through_drfs_field_pass():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    job = Job(id=uuid.uuid4(), kind="demo.noop", status="pending", input={}, created_at=at, updated_at=at)
    job._prefetched_objects_cache = {"children": []}
    with mock.patch.object(serializers.ModelSerializer, "to_representation", side_effect=AssertionError("DRF's pass")):
        data = JobSerializer(job).data
    assert data["id"] == str(job.pk) and data["status"] == "pending" and data["children"] == []
