"""jobs.serializers.FieldsBuiltOnce: a response serializer's fields are worked out once per class,
and each instance still binds fields of its own and says what DRF's own build would."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from approvals.serializers import QuestionSerializer
from jobs.serializers import JobSerializer
from jobs.services import job_submit
from tests.approvals.conftest import paused_on

pytestmark = pytest.mark.django_db


def drf_built(serializer_class: type) -> type:
    """The same serializer with DRF's own fields, built for every instance."""
    return type(f"Plain{serializer_class.__name__}", (serializer_class,), {"fields": serializers.Serializer.fields})


def test_the_fields_are_built_once_per_class_and_bound_per_instance(monkeypatch, submitter):
    job, _ = job_submit(kind="demo.noop", input={}, owner=submitter)
    first = JobSerializer(job).data
    built = []
    get_fields = serializers.ModelSerializer.get_fields
    monkeypatch.setattr(serializers.ModelSerializer, "get_fields", lambda self: built.append(self) or get_fields(self))
    one, two = JobSerializer(job), JobSerializer(job)
    assert one.data == first == two.data
    assert built == []
    assert one.fields["status"] is not two.fields["status"]
    assert one.fields["status"].parent is one and two.fields["status"].parent is two
    assert one.fields["error"] is not two.fields["error"]  # a nested serializer is its own too
    assert one.fields["error"].fields["code"].parent is one.fields["error"]


def test_what_they_say_is_what_drfs_own_build_says(submitter):
    job, _ = job_submit(kind="demo.noop", input={}, owner=submitter)
    assert JobSerializer(job).data == drf_built(JobSerializer)(job).data
    _, question = paused_on({})
    assert QuestionSerializer(question).data == drf_built(QuestionSerializer)(question).data
