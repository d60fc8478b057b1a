"""The API against its own OpenAPI document, with schemathesis.

The main run is the command line a user would type, `st run … --checks all` with every phase
(examples, coverage, fuzzing, stateful), against a real server (uvicorn) on the test database, as a
reviewer with real data of their own (`tests/api/schemathesis.toml`). It fails on any failure of
any check, and on the warnings that mean the run did not reach the API (only 404s, only 400s for
valid data). A smaller in-process walk drives each `{id}` operation through its 200s and 409s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
import schemathesis
from django.conf import settings as django_settings
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from accounts.services import api_token_create
from jobs.runner import job_execute
from jobs.services import job_submit
from tests.api.conftest import api_server_running
from tests.conftest import make_user, reviewers_group
from tests.support.processes import BASE_DIR, child_env
from waits.models import Wait
from waits.policy import WaitPolicy
from waits.services import _wait_open, wake_token  # outside any run: not fenced to one
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_create

CONFIG = Path(__file__).with_name("schemathesis.toml")
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
# Fixed, so that a failure is found again by the next run; SCHEMATHESIS_SEED tries another.
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "20"))
# Per operation and phase. About 1,300 cases over the 18 operations at 40, in about N s here.
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40"))
PHASES = "examples,coverage,fuzzing,stateful"

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


@pytest.fixture
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


def test_the_detail_operations_honour_the_schema_on_real_objects(requests_inside_the_test_transaction):
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


def reviewer_test_data(monkeypatch) -> dict[str, str]:
    """A reviewer (not staff) with a token and real rows for every `{id}` operation: a job of
    theirs paused on a question (to read, cancel and retry), another user's job paused on a
    question the reviewer may answer (its schema takes any JSON: see schemathesis.toml), a
    finished job, a webhook with a delivery, one to delete, and a job parked on an outside
    service with its wake token, and another user's job on a combined wait the reviewer may end.
    As the `ST_*` variables of `schemathesis.toml`."""
    # The rows are the point here, not the messages: nothing is sent to a worker or a receiver.
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda *, job, countdown=None: None)
    monkeypatch.setattr("webhooks.services._send_tasks", lambda ids: None)
    reviewer = make_user("rita")
    reviewer.groups.add(reviewers_group())
    webhook = webhook_create(owner=reviewer, url="https://hooks.example.com/jobs", events=["paused", "completed"])
    to_delete = webhook_create(owner=reviewer, url="https://hooks.example.com/old", events=["failed"])
    own, _ = job_submit(kind="demo.review", input={"document": "Q3 report"}, owner=reviewer)
    asked, _ = job_submit(kind="test.ask", input={"schema": {}, "prompt": "Anything?"}, owner=make_user("sam"))
    done, _ = job_submit(kind="demo.noop", owner=reviewer)
    for job in (own, asked, done):
        job_execute(job_id=job.pk)
    assert own.questions.get().status == asked.questions.get().status == "open"
    assert WebhookDelivery.objects.filter(webhook=webhook).exists()
    parked, _ = job_submit(kind="demo.noop", owner=reviewer)
    wait = _wait_open(job_id=parked.pk, key="generate", service="an outside service", policy=WaitPolicy(), person=None)
    # Another user's job parked on a combined wait (a person may end it: rita, as a reviewer).
    combined, _ = job_submit(kind="test.combined", input={"marks": [600, 1200]}, owner=make_user("wes"))
    job_execute(job_id=combined.pk)
    combined.refresh_from_db()
    combined_wait = Wait.objects.get(job=combined)
    assert combined_wait.person is not None and combined.status == "waiting"
    _, token = api_token_create(user=reviewer, name="schemathesis")
    return {
        "ST_WAIT": str(combined_wait.pk),
        "ST_TOKEN": token,
        "ST_JOB": str(own.pk),
        "ST_QUESTION": str(asked.questions.get().pk),
        "ST_WEBHOOK": str(webhook.pk),
        "ST_WEBHOOK_TO_DELETE": str(to_delete.pk),
        "ST_PARKED_JOB": str(parked.pk),
        "ST_WAKE_TOKEN": wake_token(wait.token_salt),
    }


@pytest.fixture
def api_server(transactional_db):
    """A server for this test alone. Its jobs go to a Redis key prefix of their own, which no
    worker reads (the kinds under test include ones that kill their worker), and its rate limit
    is out of the way of a run that sends thousands of requests."""
    prefix = f"{django_settings.REDIS_KEY_PREFIX}schemathesis-{uuid.uuid4().hex[:6]}:"
    try:
        with api_server_running(REDIS_KEY_PREFIX=prefix, API_THROTTLE_RATE="1000000/min") as url:
            yield url
    finally:
        client = redis.Redis.from_url(django_settings.REDIS_URL)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


@pytest.mark.timeout(900)
def test_schemathesis_with_every_check_and_phase_finds_nothing(api_server, monkeypatch, tmp_path):
    data = reviewer_test_data(monkeypatch)
    argv = [
        str(Path(sys.executable).parent / "st"), "--config-file", str(CONFIG), "--no-color", "run",
        f"{api_server}/api/schema/?format=json",
        "--checks", "all", "--phases", PHASES, "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES),
        "--report", "junit", "--report-dir", str(tmp_path),
    ]
    env = child_env(**data, ST_BASE_URL=api_server, SCHEMATHESIS_HOOKS=str(HOOKS), PYTHONPATH=str(BASE_DIR))
    run = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-20000:]
    print(run.stdout[run.stdout.rfind("Test cases:"):])  # how many cases, the seed, the time (`pytest -s`)
