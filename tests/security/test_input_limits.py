"""Item 7: input limits. A body over REQUEST_BODY_MAX_BYTES is a 413, JSON nested deeper than
JSON_MAX_DEPTH is a 400 with the usual error body (never a 500: Python's json raises
RecursionError at about 1,000 levels, which is no ValueError), on the API and on the forms that
read JSON; comments and reasons have a maximum length, and so do the demo kinds' strings."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from jobs.registry import kinds_all
from tests.approvals.conftest import paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

DEEP = "[" * 2000 + "]" * 2000
NESTED_SCHEMA = {"type": "object", "properties": {"a": {"type": "object"}}}  # answered as JSON


def api_client(user) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(user)
    return client


def post_raw(client, path: str, body: str):
    return client.post(path, data=body, content_type="application/json")


@pytest.mark.parametrize("body", [
    '{"kind": "demo.noop", "input": {"x": ' + DEEP + "}}",
    '{"kind": "demo.noop", "input": {"x": ' + "[" * 5000,   # unbalanced too
    '{"kind": "demo.noop", "input": {"x": ' + '{"a": ' * 2000 + "1" + "}" * 2000 + "}}",
])
def test_deep_nesting_on_submit_is_a_400_with_the_error_body(body):
    response = post_raw(api_client(make_user("shop")), "/api/jobs/", body)
    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == "parse_error" and "nested deeper than" in response.json()["detail"]


def test_deep_nesting_in_an_answer_is_a_400(reviewer):
    _, question = paused_on({})
    response = post_raw(api_client(reviewer), f"/api/questions/{question.pk}/answer/",
                        '{"answer": ' + DEEP + "}")
    assert response.status_code == 400 and response.json()["code"] == "parse_error"


def test_nesting_within_the_limit_and_brackets_inside_strings_are_fine():
    body = {"kind": "test.refuse", "input": {"x": json.loads("[" * 30 + "]" * 30), "text": "[" * 5000}}
    response = api_client(make_user("shop")).post("/api/jobs/", body, format="json")
    assert response.status_code == 201, response.content


@override_settings(REQUEST_BODY_MAX_BYTES=1000)
def test_a_body_over_the_limit_is_a_413():
    body = json.dumps({"kind": "test.refuse", "input": {"text": "x" * 2000}})
    response = post_raw(api_client(make_user("shop")), "/api/jobs/", body)
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large" and "1000 bytes" in response.json()["detail"]


def test_the_asgi_server_refuses_a_declared_body_over_the_limit_before_reading_it():
    from asgiref.testing import ApplicationCommunicator

    from taskplatform.asgi import application

    async def call() -> list[dict]:
        scope = {"type": "http", "method": "POST", "path": "/api/jobs/", "raw_path": b"/api/jobs/",
                 "query_string": b"", "headers": [(b"host", b"testserver"), (b"content-length", b"999999999")],
                 "http_version": "1.1", "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1)}
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": b"{", "more_body": True})
        start = await communicator.receive_output(5)
        body = await communicator.receive_output(5)
        await communicator.wait(5)
        return [start, body]

    start, body = asyncio.run(call())
    assert start["status"] == 413 and json.loads(body["body"])["code"] == "request_too_large"


def test_deep_json_in_the_job_page_answer_form_is_a_form_error(client: Client):
    make_user("boss", superuser=True)
    job, question = paused_on({"schema": NESTED_SCHEMA})
    client = Client(raise_request_exception=False)
    client.force_login(make_user("root", superuser=True))
    response = client.post(f"/jobs/{job.pk}/questions/{question.pk}/answer/", {"answer_json": DEEP, "_answer": "1"})
    assert response.status_code in (200, 400), response.status_code
    assert b"nested deeper than" in response.content


def test_deep_json_in_the_admin_submit_form_is_a_form_error():
    client = Client(raise_request_exception=False)
    client.force_login(make_user("boss", superuser=True))
    response = client.post("/admin/jobs/job/add/", {"kind": "demo.noop", "input": '{"x": ' + DEEP + "}"})
    assert response.status_code == 200 and b"nested deeper than" in response.content


def test_an_answer_comment_past_its_maximum_is_refused(reviewer):
    _, question = paused_on({"schema": {"type": "string", "maxLength": 10}})
    response = api_client(reviewer).post(f"/api/questions/{question.pk}/answer/",
                                         {"answer": "fine", "comment": "x" * 10_001}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "comment"


def test_the_answer_forms_limit_the_comment_and_the_reason():
    from approvals.forms import answer_form_for
    from approvals.models import COMMENT_MAX_LENGTH

    _, approval = paused_on({})
    form = answer_form_for(approval, {"_reject": "1", "reason": "x" * 2001})
    assert not form.is_valid() and "reason" in form.errors
    _, text = paused_on({"schema": {"type": "string", "maxLength": 10}})
    form = answer_form_for(text, {"text": "fine", "comment": "x" * (COMMENT_MAX_LENGTH + 1)})
    assert not form.is_valid() and "comment" in form.errors


def test_the_admin_bulk_reject_reason_is_limited():
    from approvals.admin.questions import QuestionActionForm

    form = QuestionActionForm({"action": "reject_selected", "reason": "x" * 2001, "select_across": "0"})
    form.fields["action"].choices = [("reject_selected", "reject")]
    assert not form.is_valid() and "reason" in form.errors


def test_every_string_of_the_demo_schemas_has_a_maximum_length():
    def strings_without_max(schema, path):
        if isinstance(schema, dict):
            if schema.get("type") == "string" and "maxLength" not in schema and "enum" not in schema:
                yield path
            for key, value in schema.items():
                yield from strings_without_max(value, f"{path}.{key}")
        elif isinstance(schema, list):
            for index, value in enumerate(schema):
                yield from strings_without_max(value, f"{path}.{index}")

    demo = [kind for kind in kinds_all() if kind.name.startswith("demo.")]
    assert demo
    missing = [path for kind in demo for path in strings_without_max(kind.input_schema, kind.name)]
    assert not missing, missing
