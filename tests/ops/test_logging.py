"""Log lines a job causes name it (id and kind), in the worker and the web server alike; JSON
under the production settings, readable under the base settings."""

from __future__ import annotations

import copy
import io
import json
import logging
import logging.config
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from jobs.models import Job
from jobs.services import job_submit
from jobs.tasks import job_run
from ops.logging import JobContextFilter, job_log_context, job_log_context_reset, job_log_context_set
from tests.conftest import make_user
from tests.support.processes import BASE_DIR, celery_worker, child_env, wait_until


def formatter_from_settings(logging_settings: dict, name: str) -> logging.Formatter:
    """The formatter `name` exactly as settings.LOGGING builds it (factories and all)."""
    config = copy.deepcopy(logging_settings)
    return logging.config.DictConfigurator(config).configure_formatter(config["formatters"][name])


def line(formatter: logging.Formatter, message: str, **extra) -> str:
    record = logging.LogRecord("jobs.runner", logging.INFO, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    JobContextFilter().filter(record)
    return formatter.format(record)


@pytest.fixture
def no_job_context():
    yield
    job_log_context_reset()


# -- the formats ------------------------------------------------------------------------------------
def test_the_readable_format_shows_the_job_only_on_its_lines(no_job_context):
    formatter = formatter_from_settings(settings.LOGGING, settings.LOG_FORMAT)
    assert settings.LOG_FORMAT == "readable"
    assert line(formatter, "idle").endswith(" INFO    jobs.runner: idle")
    job_id = uuid.uuid4()
    token = job_log_context_set(job_id=job_id, job_kind="demo.sleep")
    assert line(formatter, "step 2").endswith(f" INFO    jobs.runner [demo.sleep {job_id}]: step 2")
    job_log_context_reset(token)
    assert job_log_context() is None
    assert "[" not in line(formatter, "idle again")


def test_the_json_format_has_the_job_as_fields(no_job_context):
    formatter = formatter_from_settings(settings.LOGGING, "json")
    outside = json.loads(line(formatter, "idle"))
    assert {"time", "level", "logger", "pid", "message"} <= outside.keys() and "job_id" not in outside
    job_log_context_set(job_id="j-1", job_kind="demo.noop")
    inside = json.loads(line(formatter, "running"))
    assert inside["job_id"] == "j-1" and inside["job_kind"] == "demo.noop" and inside["message"] == "running"
    # A record that names its job itself keeps it.
    assert json.loads(line(formatter, "other", job_id="j-2", job_kind="x"))["job_id"] == "j-2"


def test_the_production_settings_write_json_lines_with_the_job():
    """A process started with the production settings, as the Docker image starts them."""
    job_id = str(uuid.uuid4())
    script = (
        "import django, logging; django.setup()\n"
        "from ops.logging import job_log_context_set\n"
        "log = logging.getLogger('jobs.runner')\n"
        "log.info('before')\n"
        f"job_log_context_set(job_id='{job_id}', job_kind='demo.noop')\n"
        "log.info('during %s', 1)\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    log.exception('it broke')\n"
    )
    env = child_env(DJANGO_SETTINGS_MODULE="taskplatform.settings.production", DJANGO_SECRET_KEY="x" * 50)
    env.pop("LOG_FORMAT", None)
    result = subprocess.run([sys.executable, "-c", script], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(text) for text in result.stderr.splitlines()]  # every line is one JSON object
    before, during, broke = lines
    assert before["message"] == "before" and "job_id" not in before
    assert during == {**during, "message": "during 1", "level": "INFO", "logger": "jobs.runner", "job_id": job_id,
                      "job_kind": "demo.noop"}
    assert broke["job_id"] == job_id and "ZeroDivisionError" in broke["exc_info"]


# -- the worker -----------------------------------------------------------------------------------
@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_names_the_job_on_the_lines_of_its_run(worker):
    """As shipped (WORKER_TASK_LOG off), Celery's per-task lines are not written; the platform's
    own lines are, naming the job."""
    seen = len(worker.lines)
    job, _ = job_submit(kind="test.flaky", input={"fail_times": 1})
    wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.COMPLETED, timeout=30)
    tag = f"[test.flaky {job.pk}]"
    wait_until(lambda: any(tag in text for text in worker.lines), timeout=10,
               message=f"no worker line names {tag}:\n{worker.output[-3000:]}")
    mine = [text for text in worker.lines if tag in text]
    assert any("jobs.runner" in text and "raised" in text for text in mine)  # the platform's own line
    time.sleep(0.5)  # a line Celery would have written after the job's last move
    written = worker.lines[seen:]
    assert not [text for text in written if "celery.app.trace" in text or "Task test.flaky[" in text], written


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_under_the_production_settings_writes_json_lines_with_the_job():
    """With WORKER_TASK_LOG=true, Celery's line per finished task is back, naming the job."""
    queue = f"json-{uuid.uuid4().hex[:6]}"
    process = celery_worker(
        name=queue, queues=queue, concurrency=1,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings_production", "DJANGO_SECRET_KEY": "x" * 50,
             "WORKER_TASK_LOG": "true"},
    ).start()  # its ready line is JSON now: `{..., "message": "json-...@host ready."}`
    try:
        with mock.patch("jobs.services.transitions.job_dispatch"):  # sent below, to this worker's queue only
            job, _ = job_submit(kind="prod.noop", input={})
        job_run.apply_async(args=[str(job.pk)], shadow=job.kind, queue=queue)
        wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.COMPLETED, timeout=30)

        def mine() -> list[dict]:
            records = [json.loads(text) for text in process.lines if text.startswith("{")]
            return [record for record in records if record.get("job_id") == str(job.pk)]

        wait_until(mine, timeout=10, message=f"no JSON line names the job:\n{process.output[-3000:]}")
    finally:
        process.stop()
    [received] = [json.loads(text) for text in process.lines if text.startswith("{") and " received" in text]
    assert received["logger"] == "celery.worker.strategy" and "prod.noop[" in received["message"]
    [succeeded] = [record for record in mine() if record["logger"] == "celery.app.trace"]
    assert succeeded["job_kind"] == "prod.noop" and succeeded["level"] == "INFO"
    assert "succeeded" in succeeded["message"] and succeeded["time"]
    # Celery's own lines are JSON too (only its banner and start-up warnings are printed, not logged).
    logged = [text for text in process.lines if text.startswith("{")]
    assert any(json.loads(text)["message"].endswith("ready.") for text in logged)


# -- the web server -------------------------------------------------------------------------------
@contextmanager
def console_output() -> Iterator[io.StringIO]:
    """What the configured console handler (settings.LOGGING) writes, while inside."""
    [console] = [handler for handler in logging.getLogger().handlers
                 if any(isinstance(f, JobContextFilter) for f in handler.filters)]
    stream = io.StringIO()
    previous = console.setStream(stream)
    try:
        yield stream
    finally:
        console.setStream(previous)


@pytest.mark.django_db
def test_a_request_about_a_job_logs_with_its_id_and_kind(client):
    client.force_login(make_user("sam", staff=True))
    job, _ = job_submit(kind="demo.noop", input={})  # pending: it cannot be retried
    unknown = uuid.uuid4()
    with console_output() as output:
        assert client.post(f"/api/jobs/{job.pk}/retry/").status_code == 409
        assert job_log_context() is None  # over with the request
        assert client.get(f"/api/jobs/{unknown}/").status_code == 404
        assert client.get("/no-such-page/").status_code == 404
    lines = output.getvalue().splitlines()
    assert any(f"django.request [demo.noop {job.pk}]: Conflict: /api/jobs/{job.pk}/retry/" in text for text in lines)
    assert any(f"django.request [? {unknown}]: Not Found: /api/jobs/{unknown}/" in text for text in lines)
    assert any("django.request: Not Found: /no-such-page/" in text for text in lines)  # no job, no tag


@pytest.mark.django_db
def test_the_event_stream_an_async_view_logs_with_the_job_too(async_client):
    job, _ = job_submit(kind="demo.noop", input={})
    with console_output() as output:
        response = async_to_sync(async_client.get)(f"/api/jobs/{job.pk}/events/stream/")  # nobody signed in
    assert response.status_code == 401
    assert f"django.request [demo.noop {job.pk}]: Unauthorized: /api/jobs/{job.pk}/events/stream/" in output.getvalue()


# -- beat -----------------------------------------------------------------------------------------
@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("send_log", [False, True], ids=["as shipped", "BEAT_SEND_LOG=true"])
def test_beat_logs_the_passes_it_sends_only_when_asked(only_own_workers, send_log):
    """As shipped, beat sends its passes (`waits.due` every second) without a line for each; its
    own lines (it leads) are written. BEAT_SEND_LOG=true brings the lines back."""
    import redis

    from tests.support.processes import celery_beat

    queue = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.REDIS_KEY_PREFIX}{settings.JOBS_PLATFORM_QUEUE}"  # no worker takes from it now
    beat = celery_beat(name=f"beat-{send_log}", env={"BEAT_SEND_LOG": str(send_log).lower()}).start()

    def passes_sent() -> int:
        # This beat's own (Celery names the sending process in each message), not another's: a
        # count of the queue's growth was met by some other process's messages once.
        origin = f"gen{beat.proc.pid}@"
        return sum(json.loads(raw).get("headers", {}).get("origin", "").startswith(origin)
                   for raw in queue.lrange(key, 0, -1))

    try:
        beat.wait_for_output("leads (epoch", timeout=30)
        wait_until(lambda: passes_sent() >= 3, timeout=15, message=f"beat sent no passes:\n{beat.output[-3000:]}")
    finally:
        beat.stop()
    sends = [line for line in beat.lines if "Sending due task" in line]
    assert bool(sends) is send_log, sends[:3]
    assert any("leads (epoch" in line for line in beat.lines)
