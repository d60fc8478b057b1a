"""Park and wake through the real thing: uvicorn (the wake route and the simulated service), a
Celery worker, Celery beat, PostgreSQL and Redis. Short marks come through the policy."""

from __future__ import annotations

import httpx
import pytest

from demo.simulator import generation_get
from jobs.models import Job
from tests.waitkinds.kinds import seen
from tests.waits.conftest import PUBLIC_URL
from tests.waits.helpers import finished, parked, submit, the_wait, wait_events
from waits.models import Wait

pytestmark = pytest.mark.worker

S = Job.Status


def test_the_callback_completes_the_job_with_exactly_one_check(stack):
    job = submit("demo.generate", prompt="a haiku about queues", delay=0.5)
    wait = parked(job)
    assert wait.external_id and wait.checks == 0
    job = finished(job)
    assert job.status == S.COMPLETED, job.error
    assert job.result == {"text": "A generated answer to: a haiku about queues"}
    wait = the_wait(job)
    assert (wait.state, wait.checks, wait.executions) == (Wait.State.SUCCEEDED, 1, 2)
    assert wait.token_used_at is not None
    # The service saw one status call and sent one callback.
    gen = generation_get(wait.external_id)
    assert (gen["status_calls"], gen["callbacks_sent"]) == ("1", "1")
    statuses = [status for status, _ in wait_events(job)]
    assert statuses == ["parked", "woken", "checked", "done"]
    woken = job.events.get(type="wait", status="woken")
    assert woken.message["by"] == "callback"
    # No worker was held: the job was `waiting` between the submit and the callback.
    assert [e.status for e in job.events.filter(type="status").order_by("seq")] == [
        "pending", "processing", "waiting", "pending", "processing", "completed"]


def test_a_dropped_callback_completes_at_the_first_backup_mark(stack):
    job = submit("test.wait", delay=0.2, drop_callback=True, marks=[1.5, 3, 4.5])
    job = finished(job)
    assert job.status == S.COMPLETED, job.error
    wait = the_wait(job)
    assert wait.checks == 1 and wait.token_used_at is None
    done_at = job.events.get(type="wait", status="done").created_at
    elapsed = (done_at - wait.accepted_at).total_seconds()
    assert 1.5 <= elapsed < 3, elapsed
    assert job.events.get(type="wait", status="woken").message["by"] == "schedule"


def test_a_generation_that_never_finishes_fails_at_the_last_mark(stack):
    job = submit("test.wait", delay=3600, marks=[1, 2, 3])
    job = finished(job)
    assert job.status == S.FAILED and job.error["code"] == "deadline_exceeded", job.error
    wait = the_wait(job)
    assert wait.state == Wait.State.FAILED and wait.checks == 3
    assert (job.finished_at - wait.accepted_at).total_seconds() >= 3
    assert [s for s, _ in wait_events(job)][-1] == "failed"


def test_throttling_is_honoured_and_does_not_start_the_mark_clock(stack):
    # Two 429s of a second each; the deadline (1.5 s after acceptance) must not count them.
    job = submit("test.wait", delay=0.3, throttle=2, marks=[0.5, 1, 1.5], max_throttle_bounces=2)
    job = finished(job)
    assert job.status == S.COMPLETED, job.error
    wait = the_wait(job)
    assert wait.throttle_bounces == 2 and wait.checks == 1
    assert (wait.accepted_at - job.created_at).total_seconds() >= 2.0
    reasons = [m["reason"] for s, m in wait_events(job) if s == "parked"]
    assert reasons == ["throttled", "throttled", "accepted"]


def test_too_many_429s_fail_the_job_as_throttled(stack):
    job = submit("test.wait", delay=0.3, throttle=3, max_throttle_bounces=2)
    job = finished(job)
    assert job.status == S.FAILED and job.error["code"] == "throttled", job.error
    assert the_wait(job).throttle_bounces == 3 and the_wait(job).accepted_at is None


FAST = {"transport_backoff": 0.05, "marks": [2, 4, 30]}


def test_transport_failures_are_retried_within_the_budget(stack):
    job = finished(submit("test.wait", delay=0.2, faults=["fault"] * 3, **FAST))
    assert job.status == S.COMPLETED, job.error
    wait = the_wait(job)
    assert (wait.transport_failures_total, wait.transport_failures, wait.checks) == (3, 0, 1)


def test_transport_failures_past_the_budget_fail_as_gateway_unavailable(stack):
    job = finished(submit("test.wait", delay=0.2, faults=["fault"] * 4, **FAST))
    assert job.status == S.FAILED and job.error["code"] == "gateway_unavailable", job.error
    assert the_wait(job).transport_failures == 4


def test_the_transport_budget_starts_again_once_a_check_reaches_the_service(stack):
    script = ["fault"] * 3 + ["pending"] + ["fault"] * 3
    job = finished(submit("test.wait", delay=0.2, faults=script, **FAST))
    assert job.status == S.COMPLETED, job.error
    wait = the_wait(job)
    assert wait.transport_failures_total == 6 and wait.checks == 2


def test_a_submit_retried_after_a_lost_answer_reuses_the_token(stack):
    job = finished(submit("test.wait", delay=0.2, submit_faults=2, **FAST))
    assert job.status == S.COMPLETED, job.error
    tokens, ids = seen(job.pk, "tokens"), seen(job.pk, "external_ids")
    assert len(tokens) == 3 and len(set(tokens)) == 1
    # The token doubled as the idempotency key: the service started one generation only.
    assert len(set(ids)) == 1 and the_wait(job).external_id == ids[0]
    assert the_wait(job).transport_failures_total == 2


def test_the_execution_backstop_stops_a_runaway_wait(stack):
    job = finished(submit("test.wait", delay=3600, marks=[0.3, 0.6, 0.9, 1.2, 1.5], max_executions=3))
    assert job.status == S.FAILED and job.error["code"] == "wait_backstop", job.error
    assert the_wait(job).executions == 4 and the_wait(job).checks == 2


def test_polling_mode_backs_off_and_completes_without_a_callback(stack):
    job = submit("test.wait", delay=1.2, callback=False, min_interval=0.2, max_interval=0.4, max_duration=10)
    job = finished(job)
    assert job.status == S.COMPLETED, job.error
    wait = the_wait(job)
    assert wait.mode == Wait.Mode.POLL and wait.checks >= 2
    assert generation_get(wait.external_id)["callback_url"] == ""
    pending = [m for s, m in wait_events(job) if s == "checked" and m["outcome"] == "pending"]
    assert pending, "progress of a pending poll shows as events"


def test_polling_mode_gives_up_after_its_maximum_duration(stack):
    job = finished(submit("test.wait", delay=3600, callback=False, min_interval=0.2, max_interval=0.4,
                          max_duration=1))
    assert job.status == S.FAILED and job.error["code"] == "deadline_exceeded", job.error


def test_forged_and_used_tokens_answer_404_and_change_nothing(stack):
    job = submit("test.wait", delay=3600, marks=[60, 120, 180])
    wait = parked(job)
    before = (Job.objects.get(pk=job.pk).event_seq, the_wait(job).next_due_at)
    forged = httpx.post(f"{PUBLIC_URL}/api/wake/{'A' * 43}/", timeout=10)
    assert forged.status_code == 404 and forged.json()["code"] == "not_found"
    assert (Job.objects.get(pk=job.pk).event_seq, the_wait(job).next_due_at) == before

    token = seen(job.pk, "tokens")[0]
    first = httpx.post(f"{PUBLIC_URL}/api/wake/{token}/", timeout=10)
    assert first.status_code == 202
    # The early wake makes one check (still running) and parks again until the next mark.
    wait = wait_until_checked(job, 1)
    seq = Job.objects.get(pk=job.pk).event_seq
    again = httpx.post(f"{PUBLIC_URL}/api/wake/{token}/", timeout=10)
    assert again.status_code == 404
    assert Job.objects.get(pk=job.pk).event_seq == seq and the_wait(job).checks == 1
    assert wait.state == Wait.State.WAITING


def wait_until_checked(job: Job, checks: int) -> Wait:
    from tests.support.processes import wait_until

    return wait_until(
        lambda: Wait.objects.filter(job=job, checks=checks, job__status=S.WAITING).first(), timeout=20,
        message=f"job {job.pk} was not checked {checks} time(s) and parked again",
    )


def test_the_database_holds_no_token_in_clear(stack):
    from django.db import connection

    job = finished(submit("demo.generate", prompt="secret", delay=0.2))
    assert job.status == S.COMPLETED
    gen_id = the_wait(job).external_id
    token = httpx.get(f"{PUBLIC_URL}/sim/generate/{gen_id}/", timeout=10)  # the service knows it; we do not
    assert token.status_code == 200
    callback_url = generation_get(gen_id)["callback_url"]
    clear = callback_url.rstrip("/").rsplit("/", 1)[-1]
    assert len(clear) >= 40
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            quoted = connection.ops.quote_name(table)
            if connection.vendor == "postgresql":
                cursor.execute(f"SELECT count(*) FROM {quoted} AS t WHERE t::text LIKE %s", [f"%{clear}%"])
                found = cursor.fetchone()[0]
            else:  # no row-to-text cast elsewhere: read every row
                cursor.execute(f"SELECT * FROM {quoted}")
                found = sum(1 for row in cursor.fetchall() if clear in repr(row))
            assert found == 0, f"the token is in clear in {table}"
    import hashlib

    assert the_wait(job).token_hash == hashlib.sha256(clear.encode()).hexdigest()


def test_a_worker_restarted_while_a_job_waits_loses_nothing(stack):
    job = submit("test.wait", delay=2, marks=[30, 60, 90])
    wait = parked(job)
    stack.kill()  # a crash, not a polite stop
    stack.start()
    job = finished(job)
    assert job.status == S.COMPLETED, job.error
    after = the_wait(job)
    assert after.external_id == wait.external_id and after.checks == 1
