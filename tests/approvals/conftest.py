"""Helpers of the reviewers' tests: jobs paused on a question of any type, groups, users."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission

from approvals.models import Question
from jobs.models import Job
from jobs.registry import _kinds, kind_get
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user


def paused_on(input: dict[str, Any], *, owner: Any = None, kind: str = "test.ask") -> tuple[Job, Question]:
    """Submit a `test.ask` job with `input`, run it once in this process; it pauses on its question."""
    job, _ = job_submit(kind=kind, input=input, owner=owner)
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == Job.Status.PAUSED, (job.status, job.error)
    return job, Question.objects.get(job=job)


def answer_group(name: str) -> Group:
    """A group whose members may answer questions (holds the answer permission)."""
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.add(Permission.objects.get(codename="answer_question"),
                          Permission.objects.get(codename="view_question"))
    return group


def member_of(group: Group, username: str, **kwargs: Any):
    user = make_user(username, **kwargs)
    user.groups.add(group)
    return user


@pytest.fixture
def kind_options(monkeypatch):
    """Change a registered kind's options for one test: `kind_options("test.ask", allow_self_approval=True)`."""

    def change(name: str, **options: Any) -> None:
        monkeypatch.setitem(_kinds, name, dataclasses.replace(kind_get(name), **options))

    return change
