"""Fixtures of the API tests: users with tokens, a job paused on a question, a real server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from accounts.services import api_token_create
from approvals.models import Question
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user, reviewers_group
from tests.live.conftest import asgi_server, wait_until_serving


def client_for(user) -> APIClient:
    """An API client that authenticates as `user` with a fresh token, as an integration would."""
    _, key = api_token_create(user=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def api(submitter) -> APIClient:
    """The submitter's client."""
    return client_for(submitter)


@pytest.fixture
def other(db):
    return make_user("other")


@pytest.fixture
def other_api(other) -> APIClient:
    return client_for(other)


@pytest.fixture
def desk_reviewer(db):
    """A reviewer who is not staff: sees jobs only through the questions they may answer."""
    user = make_user("desk")
    user.groups.add(reviewers_group())
    assert not user.is_staff and Group.objects.filter(user=user, name="reviewers").exists()
    return user


@pytest.fixture
def reviewer_api(desk_reviewer) -> APIClient:
    return client_for(desk_reviewer)


@pytest.fixture
def staff_api(superuser) -> APIClient:
    return client_for(superuser)


@pytest.fixture
def paused_review(submitter):
    """A `demo.review` job of the submitter, paused on its `approve` question."""
    job, _ = job_submit(kind="demo.review", input={"document": "Q3 report"}, owner=submitter)
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "paused"
    return job, Question.objects.get(job=job)


@pytest.fixture
def dispatched(monkeypatch) -> list:
    """The jobs whose Celery message was sent (recorded instead of sent)."""
    sent: list = []
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda *, job, countdown=None: sent.append(job.pk))
    return sent


@contextmanager
def api_server_running(**env: str) -> Iterator[str]:
    """uvicorn on the test database (a test with it must be transactional), with `env` on top of
    what the tests' processes share; yields its base URL."""
    server = asgi_server()
    server.env = {**server.env, **env}
    server.start()
    try:
        wait_until_serving(server.url)
        yield server.url
    finally:
        server.stop()
