"""The backbone through the real thing: a Celery worker process, the real database and Redis."""

import pytest

from approvals.models import Question
from approvals.services import InvalidAnswer, question_answer
from jobs.models import Job
from jobs.services import job_cancel, job_dispatch, job_retry, job_submit
from tests.conftest import make_user
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
S = Job.Status


def status_of(job):
    return Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()


def wait_status(job, *statuses, timeout=30.0):
    wait_until(lambda: status_of(job) in statuses, timeout=timeout,
               message=f"job {job.pk} did not reach {statuses}; it is {status_of(job)}")
    return Job.objects.get(pk=job.pk)


def assert_gapless(job):
    seqs = list(job.events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, job.event_seq + 1))


def test_review_job_pauses_for_a_person_and_completes_after_the_answer(worker):
    reviewer = make_user("rita", reviewer=True)
    job, _ = job_submit(kind="demo.review", input={"document": "Contract v2"})
    wait_status(job, S.PAUSED)
    question = Question.objects.get(job=job, status="open")
    # A wrong answer is refused and changes nothing.
    with pytest.raises(InvalidAnswer):
        question_answer(question_id=question.pk, user=reviewer, answer={"approved": "sure"})
    assert status_of(job) == S.PAUSED
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, channel="admin")
    job = wait_status(job, S.COMPLETED)
    assert job.result == {"approved": True, "reviewer": "rita"}
    statuses = list(job.events.filter(type="status").order_by("seq").values_list("status", flat=True))
    assert statuses == ["pending", "processing", "paused", "pending", "processing", "completed"]
    assert_gapless(job)


def test_duplicate_deliveries_run_a_job_once(worker):
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0.6, "steps": 3})
    for _ in range(3):  # the same message, delivered again
        job_dispatch(job=job)
    job = wait_status(job, S.COMPLETED)
    assert job.attempts == 1
    assert job.result["step_runs"] == {"1": 1, "2": 1, "3": 1}
    assert job.events.filter(type="status", status="processing").count() == 1
    assert_gapless(job)


def test_a_resumed_sleep_does_not_rerun_finished_steps(worker):
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 3, "steps": 6})
    wait_until(lambda: len(Job.objects.get(pk=job.pk).checkpoint) >= 2, timeout=20, message="no steps finished")
    job_cancel(job_id=job.pk)  # the run stops at its next ctx call
    wait_until(lambda: Job.objects.get(pk=job.pk).events.filter(type="step").count() > 0)
    finished = set(Job.objects.get(pk=job.pk).checkpoint)
    job_retry(job_id=job.pk)
    job = wait_status(job, S.COMPLETED)
    runs = job.result["step_runs"]
    assert set(runs) == {"1", "2", "3", "4", "5", "6"}
    # Steps finished before the cancel ran once; only the step in flight may have run twice.
    assert all(runs[name] == 1 for name in finished), runs
    assert sum(1 for count in runs.values() if count > 1) <= 1, runs
    skipped = set(job.events.filter(type="step", status="skipped").values_list("step", flat=True))
    assert finished <= skipped


def test_failing_job_retries_with_backoff_then_succeeds(worker):
    job, _ = job_submit(kind="test.flaky", input={"fail_times": 2})
    job = wait_status(job, S.COMPLETED, S.FAILED)
    assert job.status == S.COMPLETED and job.attempts == 3
    assert job.result["step_runs"] == {"a": 1, "body": 3}
    retries = job.events.filter(type="status", status="pending").count()
    assert retries == 3  # submitted, then two retries


def test_failing_job_fails_after_max_attempts_with_the_error(worker):
    job, _ = job_submit(kind="test.flaky", input={"fail_times": 9})
    job = wait_status(job, S.FAILED)
    assert job.attempts == 3 and job.error["code"] == "exception"
    assert "planned failure on attempt 3" in job.error["message"]
    assert job.events.order_by("-seq").first().status == "failed"


def test_a_lost_dispatch_is_sent_again_by_the_reconciler(worker):
    from datetime import timedelta
    from unittest import mock

    from django.utils import timezone

    from jobs.tasks import jobs_reconcile

    # A crash between the commit and the publish: the row exists, the message never left.
    with mock.patch("jobs.services.transitions.job_dispatch") as lost:
        job, _ = job_submit(kind="demo.noop", input={})
    assert lost.called
    Job.objects.filter(pk=job.pk).update(updated_at=timezone.now() - timedelta(minutes=10))
    assert status_of(job) == S.PENDING
    assert jobs_reconcile()["redispatched"] == 1
    assert jobs_reconcile()["redispatched"] == 0  # touched: not sent twice within the grace period
    wait_status(job, S.COMPLETED)
