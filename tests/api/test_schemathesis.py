"""Property-based tests of the whole API against its own OpenAPI document (schemathesis): for
generated requests, valid and invalid, no 5xx, and every response (status, headers, body) is one
the document allows. Runs in-process on Django's WSGI handler, as a signed-in superuser, so that
every endpoint's deepest paths (answers, cancels) are reachable."""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

from accounts.services import api_token_create
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.conftest import make_user

schemathesis.checks.load_all_checks()
CHECKS = [
    schemathesis.checks.CHECKS.get_one(name)
    for name in (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    )
]


# Loaded from the app itself (the schema view is public and reads no database). Eager, not
# through `schemathesis.pytest.from_fixture`, whose lazy loader does not run under pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", WSGIHandler())


@pytest.fixture(autouse=True)
def requests_inside_the_test_transaction(db):
    """Django closes "old" connections when a request starts and ends; inside a test's
    transaction that would drop the transaction, so (as Django's own test client does) that is
    switched off while these tests send requests through the WSGI handler."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def token(db) -> str:
    """A superuser's token, with a job paused on a question and a finished one in the database."""
    boss = make_user("boss", superuser=True)
    paused, _ = job_submit(kind="demo.review", input={"document": "d"}, owner=boss)
    job_execute(job_id=paused.pk)
    done, _ = job_submit(kind="demo.noop", owner=boss)
    job_execute(job_id=done.pk)
    _, key = api_token_create(user=boss)
    return key


@schema.parametrize()
@settings(max_examples=int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "20")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=not os.environ.get("SCHEMATHESIS_RANDOM"))
def test_the_api_honours_its_schema(case, token):
    case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)


def test_the_detail_operations_honour_the_schema_on_real_objects(db):
    """Generated ids are almost never real, so walk each `{id}` operation once on real rows too:
    200s, then the 409s of repeating a cancel and an answer."""
    boss = make_user("boss", superuser=True)
    job, _ = job_submit(kind="demo.review", input={"document": "d"}, owner=boss)
    job_execute(job_id=job.pk)
    question = job.questions.get()
    _, key = api_token_create(user=boss)
    headers = {"Authorization": f"Token {key}"}

    def call(path: str, method: str, expected: int, **kwargs) -> None:
        case = schema[path][method].Case(**kwargs)
        response = case.call_and_validate(headers=headers, checks=CHECKS)
        assert response.status_code == expected, (method, path, response.text)

    call("/api/jobs/{id}/", "GET", 200, path_parameters={"id": str(job.pk)})
    call("/api/jobs/{id}/events/", "GET", 200, path_parameters={"id": str(job.pk)}, query={"after": 1})
    call("/api/questions/{id}/", "GET", 200, path_parameters={"id": str(question.pk)})
    call("/api/questions/{id}/answer/", "POST", 400, path_parameters={"id": str(question.pk)}, body={"answer": {}})
    call("/api/questions/{id}/answer/", "POST", 200, path_parameters={"id": str(question.pk)},
         body={"answer": {"approved": True}, "comment": "fine"})
    call("/api/questions/{id}/answer/", "POST", 409, path_parameters={"id": str(question.pk)},
         body={"answer": {"approved": True}})
    call("/api/jobs/{id}/retry/", "POST", 409, path_parameters={"id": str(job.pk)})
    call("/api/jobs/{id}/cancel/", "POST", 200, path_parameters={"id": str(job.pk)})
    call("/api/jobs/{id}/cancel/", "POST", 409, path_parameters={"id": str(job.pk)})
    call("/api/jobs/{id}/retry/", "POST", 200, path_parameters={"id": str(job.pk)})
    call("/api/jobs/", "POST", 201, body={"kind": "demo.noop", "input": {}, "idempotency_key": "k"})
    call("/api/jobs/", "POST", 200, body={"kind": "demo.noop", "input": {}, "idempotency_key": "k"})
    call("/api/jobs/", "POST", 409, body={"kind": "demo.sleep", "input": {"seconds": 0, "steps": 1},
                                          "idempotency_key": "k"})
