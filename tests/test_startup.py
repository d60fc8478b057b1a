"""What a platform process loads at start: daphne (and with it Twisted and autobahn) only for
`manage.py runserver`, whose ASGI server it is. Everywhere else it cost about 0.6 s of start-up
and 23 MB per process (taskplatform/settings/base.py). The web process loads at start what its
first requests would otherwise load (taskplatform/asgi.py), a worker what its pool's work would
(taskplatform/celery.py), and no process the test harness or an HTTP client at its start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
TWISTED = {"daphne", "twisted", "autobahn"}

LOADED = """
import sys
import django
django.setup()
import taskplatform.asgi, taskplatform.celery
from django.conf import settings
print(sorted({name.split(".")[0] for name in sys.modules} & %r))
print("daphne app" if "daphne" in settings.INSTALLED_APPS else "no daphne app")
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(BASE_DIR), "DJANGO_SETTINGS_MODULE": "taskplatform.settings.development",
            **extra}


def test_the_web_server_and_the_workers_load_no_twisted():
    out = subprocess.run([sys.executable, "-c", LOADED % (TWISTED,)], cwd=BASE_DIR, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["[]", "no daphne app"], out.stdout


# Loaded by no process's start (Django's apps made ready and the Celery app: a command, beat, a
# worker before it loads what its pool uses): the test harness and its doubles, which only a test
# uses, and what only a worker's sending uses, an HTTP client and DRF's serializers (the web's
# URLconfs load those before it serves). Some 270 modules, a fifth of a command's start.
NOT_AT_START = ("jobs.testing", "approvals.testing", "waits.testing", "unittest.mock", "httpx", "requests",
                "rest_framework.serializers", "rest_framework.renderers")
STARTED = f"""
import sys
import django
django.setup()
import taskplatform.celery
print(" ".join(name for name in {NOT_AT_START!r} if name in sys.modules) or "none")
"""


@pytest.mark.parametrize("settings_module", ["production", "development"])
def test_a_process_starts_without_the_test_harness_or_an_http_client(settings_module):
    env = _env(DJANGO_SETTINGS_MODULE=f"taskplatform.settings.{settings_module}", DJANGO_SECRET_KEY="x" * 50,
               DJANGO_SECURE_COOKIES="false")
    out = subprocess.run([sys.executable, "-c", STARTED], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none"], out.stdout


def test_runserver_still_serves_asgi_through_daphne():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=BASE_DIR, env=_env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as client:
                    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    reply = client.recv(200)
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("runserver never answered")
        assert reply.startswith(b"HTTP/1.1 200"), reply
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "Starting ASGI/Daphne" in output, output


WARM = """
import sys, threading
import taskplatform.asgi
from taskplatform.celery import app
from approvals.serializers import AnswerSerializer, QuestionSerializer
from jobs.serializers import JobSerializer, JobSubmitSerializer
in_a_thread = []
reader = threading.Thread(target=lambda: in_a_thread.append(app.backend))
reader.start()
reader.join()
print(app.finalized, "jobs.apis" in sys.modules, "channels_redis.core" in sys.modules,
      any(thread.name == "job-event-publisher" for thread in threading.enumerate()),
      app._backend_cache is not None and in_a_thread == [app._backend_cache],
      all("_field_prototypes" in serializer.__dict__
          for serializer in (JobSerializer, JobSubmitSerializer, QuestionSerializer, AnswerSerializer)))
"""


def test_the_web_process_loads_what_its_first_requests_need_before_it_serves():
    """The first `POST /api/jobs/` of a new web process took 200-230 ms (the URLconfs, DRF's
    classes, Celery's task registry, the channel layer imported on the way), the next ones 10-15.
    Then Celery's result backend (none: found out from every package's entry points, in each
    request thread at its first message) and the serializers' fields, at a process's first answer."""
    out = subprocess.run([sys.executable, "-c", WARM], cwd=BASE_DIR, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"] * 6, out.stdout


FIRST_REQUESTS = """
import json, sys
import taskplatform.asgi
from django.test import Client
key, question = sys.argv[1:3]
client, headers = Client(), {"HTTP_AUTHORIZATION": f"Token {key}"}
loaded = set(sys.modules)
answers = []
for method, path, body in (("post", "/api/jobs/", {"kind": "demo.noop", "input": {}}),
                           ("post", f"/api/questions/{question}/answer/", {"answer": {"approved": True}}),
                           ("get", "/api/jobs/", None)):
    if body is None:
        response = getattr(client, method)(path, **headers)
    else:
        response = getattr(client, method)(path, json.dumps(body), content_type="application/json", **headers)
    answers.append([response.status_code, sorted(set(sys.modules) - loaded)])
    loaded = set(sys.modules)
print(json.dumps(answers))
"""


@pytest.mark.django_db(transaction=True)
def test_a_new_web_processs_first_submit_answer_and_list_import_nothing():
    """The first answer of each web process imported Celery's tasks module and its worker-side
    machinery (some 100 ms); the first submit, the session's serializer and the messages' storage."""
    from accounts.services import api_token_create, user_ensure
    from approvals.models import Question
    from jobs.runner import job_execute
    from jobs.services import job_submit
    from tests.support.processes import child_env

    user, _ = user_ensure(username="first-requests", superuser=True)
    key = api_token_create(user=user, name="first requests")[1]
    # Run here, not by the session's worker (which may be running): it would claim it first.
    with mock.patch("jobs.services.transitions.job_dispatch"):
        job, _ = job_submit(kind="demo.review", input={"document": "first"})
    job_execute(job_id=job.pk)
    question = Question.objects.get(job_id=job.pk, status=Question.Status.OPEN)
    out = subprocess.run([sys.executable, "-c", FIRST_REQUESTS, key, str(question.pk)], cwd=BASE_DIR,
                         env=child_env(PYTHONPATH=str(BASE_DIR)), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    answers = json.loads(out.stdout.strip().splitlines()[-1])
    assert [status for status, _ in answers] == [201, 200, 200], out.stderr[-2000:]
    assert [imported for _, imported in answers] == [[], [], []]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_pool_process_has_what_its_work_imports_before_its_first_job(only_own_workers):
    """A worker's main process loads what no start-up loads and its pool's work would (an HTTP
    client for webhooks and outside calls, a webhook payload's serializer) before it forks: each
    pool process shares them instead of importing its own at its first webhook. Celery's start-up
    run of Django's checks, which loads the URLconfs and with them DRF, is off here, so that only
    that loading can have loaded them."""
    from jobs.models import Job
    from jobs.services import job_submit
    from taskplatform.celery import POOL_PRELOADED
    from tests.support.processes import celery_worker, wait_until

    worker = celery_worker(name="preloads", concurrency=1, env={"CELERY_SKIP_CHECKS": "1"}).start()
    try:
        job, _ = job_submit(kind="test.process_state", input={})
        wait_until(lambda: Job.objects.filter(pk=job.pk, status=Job.Status.COMPLETED).exists(), timeout=30,
                   message=f"job {job.pk} did not complete")
    finally:
        worker.stop()
    assert Job.objects.get(pk=job.pk).result["preloaded"] == sorted(POOL_PRELOADED)
