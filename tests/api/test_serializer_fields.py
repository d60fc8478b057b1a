"""jobs.serializers.FieldsBuiltOnce: the fields of a response's serializer, and of a request body's,
are worked out once per class, and each instance still binds fields of its own and says (or takes
and refuses) what DRF's own build would."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from approvals.serializers import AnswerSerializer, QuestionSerializer
from jobs.serializers import JobSerializer, JobSubmitSerializer
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


@pytest.mark.parametrize("serializer_class, bodies", [
    (JobSubmitSerializer, [{"kind": "demo.noop"}, {"kind": "demo.noop", "input": {"n": 1}, "idempotency_key": "k"},
                           {"kind": 3}, {"input": []}, {"kind": "x" * 101, "idempotency_key": None},
                           {"kind": "a\x00b", "input": {"k": "\x00"}}]),
    (AnswerSerializer, [{"answer": True}, {"answer": None, "comment": "why"}, {}, {"answer": 1, "comment": 2},
                        {"answer": {"a": "\x00"}, "comment": "c" * 5000}]),
])
def test_a_request_bodys_fields_built_once_validate_as_drfs_own(monkeypatch, serializer_class, bodies):
    """A request body's serializer builds its fields once, and takes and refuses what DRF's own
    build does, each instance its own fields, however many validate one after the other (no state
    left in a shared field)."""
    plain = drf_built(serializer_class)
    assert serializer_class(data=bodies[0]).is_valid()
    built = []
    get_fields = serializers.Serializer.get_fields
    monkeypatch.setattr(serializer_class, "get_fields", lambda self: built.append(self) or get_fields(self))
    for body in [*bodies, *bodies]:
        ours, theirs = serializer_class(data=body), plain(data=body)
        assert ours.is_valid() == theirs.is_valid(), body
        assert ours.errors == theirs.errors, body
        if not ours.errors:
            assert ours.validated_data == theirs.validated_data, body
    assert len(built) == len(bodies) * 2  # DRF's own build's, not ours
    one, two = serializer_class(data=bodies[0]), serializer_class(data=bodies[0])
    assert all(one.fields[name] is not two.fields[name] and one.fields[name].parent is one for name in one.fields)
