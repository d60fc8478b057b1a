"""GET /metrics: refused without staff or the token; its numbers are what the jobs really did,
read back through prometheus-client's own parser."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from django.conf import settings as django_settings
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import Question
from approvals.services import question_answer
from jobs.models import Job
from jobs.registry import JobKind, _kinds
from jobs.services import job_claim, job_dispatch, job_submit, job_suspend
from tests.conftest import make_user
from tests.support.processes import wait_until
from waits.models import Wait
from waits.services import wait_check_now

TOKEN = "metrics-test-token"
S = Job.Status


def scrape(client) -> list:
    """Every sample of one scrape with the bearer token, as (name, labels, value)."""
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    ]


def value(samples: list, name: str, **labels: str) -> float | None:
    """The value of the one sample `name` whose labels include `labels`, or None."""
    found = [v for sample_name, sample_labels, v in samples
             if sample_name == name and labels.items() <= sample_labels.items()]
    assert len(found) <= 1, f"{name} {labels} matches {len(found)} samples"
    return found[0] if found else None


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN
    return TOKEN


# -- who may read -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_without_credentials_the_answer_is_401_saying_what_to_send(client, token):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    body = response.json()
    assert body["code"] == "not_authenticated" and "Authorization: Bearer" in body["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["Bearer wrong-token", f"Bearer {TOKEN}x", "Bearer ", "bearer metrics-test-tok"])
def test_a_wrong_bearer_token_is_401(client, token, header):
    response = client.get("/metrics", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


@pytest.mark.django_db
def test_without_a_configured_token_no_bearer_token_opens_them(client, settings):
    settings.METRICS_TOKEN = ""
    for header in ("Bearer ", "Bearer anything"):
        assert client.get("/metrics", headers={"Authorization": header}).status_code == 401


@pytest.mark.django_db
def test_a_signed_in_user_who_is_not_staff_gets_403(client, token):
    client.force_login(make_user("ann"))
    response = client.get("/metrics")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


@pytest.mark.django_db
def test_staff_and_the_token_may_read_them(client, token):
    assert value(scrape(client), "taskplatform_metrics_source_up", source="database") == 1
    client.force_login(make_user("sam", staff=True))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"# TYPE taskplatform_jobs gauge" in response.content
    # Each scrape has its own registry: nothing lands in prometheus-client's global one.
    assert b"taskplatform_" not in generate_latest(REGISTRY)


@pytest.mark.django_db
def test_openmetrics_when_the_scraper_asks_for_it(client, token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}",
                                               "Accept": "application/openmetrics-text; version=1.0.0"})
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert b"# TYPE taskplatform_job_run_duration_seconds gaugehistogram" in response.content
    assert response.content.endswith(b"# EOF\n")


# -- what they say --------------------------------------------------------------------------------
@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_metrics_count_what_a_real_worker_did(client, token, worker):
    reviewer = make_user("rita", reviewer=True)
    noops = [job_submit(kind="demo.noop", input={})[0] for _ in range(2)]
    flaky, _ = job_submit(kind="test.flaky", input={"fail_times": 1})  # fails once, then completes
    refused, _ = job_submit(kind="test.refuse", input={})  # fails at once with the code bad_data
    review, _ = job_submit(kind="demo.review", input={"document": "Q3"})  # asks a person
    wanted = {**{job.pk: S.COMPLETED for job in [*noops, flaky]}, refused.pk: S.FAILED, review.pk: S.PAUSED}
    wait_until(lambda: dict(Job.objects.filter(pk__in=wanted).values_list("pk", "status")) == wanted,
               timeout=60, message="the jobs did not all finish or pause")

    samples = scrape(client)
    assert value(samples, "taskplatform_metrics_source_up", source="database") == 1
    assert value(samples, "taskplatform_metrics_source_up", source="redis") == 1
    # Jobs by kind and status.
    assert value(samples, "taskplatform_jobs", kind="demo.noop", status="completed") == 2
    assert value(samples, "taskplatform_jobs", kind="test.flaky", status="completed") == 1
    assert value(samples, "taskplatform_jobs", kind="test.refuse", status="failed") == 1
    assert value(samples, "taskplatform_jobs", kind="demo.review", status="paused") == 1
    assert value(samples, "taskplatform_jobs_failed", kind="test.refuse", code="bad_data") == 1
    # Transitions, from the event log: 5 submissions and 1 retry into pending, 6 runs, ...
    transitions = {status: value(samples, "taskplatform_job_transitions_total", status=status) for status in S.values}
    assert transitions == {"pending": 6, "processing": 6, "paused": 1, "waiting": 0, "completed": 3,
                           "failed": 1, "cancelled": 0}
    assert value(samples, "taskplatform_job_failures_total", code="bad_data") == 1
    assert value(samples, "taskplatform_job_retries_total", reason="error") == 1
    assert value(samples, "taskplatform_job_retries_total", reason="manual") == 0
    # Run durations: one observation per finished job, in the buckets of its kind and outcome.
    noop_runs = {"kind": "demo.noop", "status": "completed"}
    assert value(samples, "taskplatform_job_run_duration_seconds_bucket", le="+Inf", **noop_runs) == 2
    assert value(samples, "taskplatform_job_run_duration_seconds_bucket", le="60.0", **noop_runs) == 2
    assert value(samples, "taskplatform_job_run_duration_seconds_gcount", **noop_runs) == 2
    assert 0 < value(samples, "taskplatform_job_run_duration_seconds_gsum", **noop_runs) < 60
    assert value(samples, "taskplatform_job_run_duration_seconds_bucket", le="+Inf", kind="test.refuse",
                 status="failed") == 1
    # The open question and its age.
    assert value(samples, "taskplatform_questions_open") == 1
    assert value(samples, "taskplatform_questions_overdue") == 0
    assert 0 < value(samples, "taskplatform_question_oldest_open_age_seconds") < 120
    assert value(samples, "taskplatform_question_answer_latency_seconds_bucket", le="+Inf") == 0
    # The broker: the default queue is consumed by the live worker, and nothing is left in it.
    assert value(samples, "taskplatform_queue_depth", queue="jobs") == 0
    assert value(samples, "taskplatform_queue_consumers", queue="jobs") >= 1
    last_jobs = [v for name, _, v in samples if name == "taskplatform_worker_last_job_timestamp_seconds"]
    assert last_jobs and time.time() - max(last_jobs) < 60

    question = Question.objects.get(job=review, status="open")
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, channel="api")
    wait_until(lambda: Job.objects.get(pk=review.pk).status == S.COMPLETED, timeout=30)
    samples = scrape(client)
    assert value(samples, "taskplatform_questions_open") == 0
    assert value(samples, "taskplatform_question_oldest_open_age_seconds") == 0
    assert value(samples, "taskplatform_question_answer_latency_seconds_bucket", le="+Inf") == 1
    assert value(samples, "taskplatform_question_answer_latency_seconds_bucket", le="60.0") == 1
    assert value(samples, "taskplatform_job_transitions_total", status="completed") == 4


@pytest.mark.django_db
def test_a_parked_job_and_its_wake_latency(client, token):
    """Park a job on a wait, wake it from the admin, run it again: the wait shows while it is
    active, and the wake's latency (woken event to processing event) is observed once."""
    job, _ = job_submit(kind="demo.noop", input={})
    job = job_claim(job_id=job.pk)
    wait = Wait.objects.create(job=job, key="generate", service="simulated generation", state=Wait.State.WAITING,
                               token_salt="salt", token_hash=uuid.uuid4().hex * 2)
    job_suspend(job=job, to="waiting", apply=lambda job: False, message={"wait": "generate"}, on="wait:generate")
    samples = scrape(client)
    assert value(samples, "taskplatform_waits_active", service="simulated generation", state="waiting") == 1
    assert value(samples, "taskplatform_jobs", kind="demo.noop", status="waiting") == 1
    assert value(samples, "taskplatform_wake_latency_seconds_bucket", le="+Inf") is None  # no wake yet

    wait_check_now(wait_id=wait.pk)  # a person asks for a look: woken by admin, back to pending
    Wait.objects.filter(pk=wait.pk).update(woken_at=None)  # what the run's wait_for does first
    job_claim(job_id=job.pk)
    samples = scrape(client)
    assert value(samples, "taskplatform_wake_latency_seconds_bucket", by="admin", le="+Inf") == 1
    assert value(samples, "taskplatform_wake_latency_seconds_bucket", by="admin", le="60.0") == 1
    assert 0 < value(samples, "taskplatform_wake_latency_seconds_gsum", by="admin") < 60
    assert value(samples, "taskplatform_job_transitions_total", status="waiting") == 1


@pytest.fixture
def queued_kind(monkeypatch):
    """A kind with a queue of its own that no worker consumes; its messages stay there."""
    queue = f"ops-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setitem(_kinds, "ops.queued", JobKind(name="ops.queued", handler=lambda ctx, input: {}, queue=queue))
    yield queue
    prefix = django_settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    redis.Redis.from_url(django_settings.REDIS_URL).delete(f"{prefix}{queue}")


@pytest.mark.django_db
def test_queue_depth_counts_the_messages_waiting_in_a_kinds_queue(client, token, queued_kind):
    for _ in range(3):
        job_dispatch(job=Job(pk=uuid.uuid4(), kind="ops.queued"))
    samples = scrape(client)
    assert value(samples, "taskplatform_queue_depth", queue=queued_kind) == 3
    assert value(samples, "taskplatform_queue_consumers", queue=queued_kind) == 0
    assert value(samples, "taskplatform_queue_depth", queue="jobs") is not None


@pytest.mark.django_db
def test_a_source_that_does_not_answer_is_reported_and_the_rest_still_shows(client, token, settings, tmp_path):
    settings.REDIS_URL = f"unix://{tmp_path}/nothing-listens-here.sock"
    samples = scrape(client)
    assert value(samples, "taskplatform_metrics_source_up", source="redis") == 0
    assert value(samples, "taskplatform_metrics_source_up", source="database") == 1
    assert value(samples, "taskplatform_questions_open") == 0
    assert value(samples, "taskplatform_queue_depth", queue="jobs") is None
