"""A run that meets a database error (issue 13, item 4): only a proven loss of the database (its
connection died, or it does not answer) hands the job back without spending an attempt, and a
hand-back has a budget and a back-off; anything else is the job's own error."""

import pytest
from django.db import connection

from demo.services import step_runs
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_claim, job_hand_back, job_submit

S = Job.Status
needs_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="terminates a PostgreSQL backend")


def last_status_event(job):
    return Job.objects.get(pk=job.pk).events.filter(type="status").order_by("-seq").first()


@pytest.mark.django_db
def test_an_error_that_only_mentions_the_connection_while_the_database_answers_is_the_jobs_own():
    job, _ = job_submit(kind="test.database_error", input={"real": False})
    assert job_execute(job_id=job.pk) == "pending"  # an ordinary retry, after its back-off
    job.refresh_from_db()
    assert job.error["code"] == "exception" and "connection was reset" in job.error["message"]
    assert job.attempts == 1 and job.max_attempts == 3 and job.run_after is not None
    assert "handed_back" not in last_status_event(job).message


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_a_connection_that_really_died_hands_the_job_back_without_spending_an_attempt(only_own_workers):
    job, _ = job_submit(kind="test.database_error", input={"real": True})
    assert job_execute(job_id=job.pk) == "pending"
    job.refresh_from_db()
    assert job.attempts == 1 and job.max_attempts == 4 and job.error is None and job.hand_backs == 1
    assert job.run_after is None  # the first hand-back goes again at once
    assert last_status_event(job).message["handed_back"] is True
    assert step_runs(job_id=job.pk) == {"a": 1, "body": 1}


@pytest.mark.django_db
def test_hand_backs_have_a_budget_and_a_back_off_then_count_as_a_failure(settings, django_capture_on_commit_callbacks):
    settings.JOBS_HAND_BACK_BUDGET = 2
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 1})
    delays = []
    for _ in range(2):
        claimed = job_claim(job_id=job.pk)
        back = job_hand_back(job=claimed, reason="the database connection was lost")
        assert back.status == S.PENDING and back.error is None
        delays.append(back.run_after)
        Job.objects.filter(pk=job.pk).update(run_after=None)
    assert delays[0] is None and delays[1] is not None  # the second waits a back-off
    claimed = job_claim(job_id=job.pk)
    over = job_hand_back(job=claimed, reason="the database connection was lost")
    # Past the budget: an ordinary failed attempt, retried after its back-off while attempts remain.
    assert over.status == S.PENDING and over.error["code"] == "too_many_hand_backs"
    assert over.attempts == 3 and over.max_attempts == 5 and over.hand_backs == 2
    assert "handed_back" not in last_status_event(job).message
    Job.objects.filter(pk=job.pk).update(run_after=None)  # its back-off has passed
    claimed = job_claim(job_id=job.pk)
    Job.objects.filter(pk=job.pk).update(max_attempts=claimed.attempts)
    claimed.max_attempts = claimed.attempts
    assert job_hand_back(job=claimed, reason="again").status == S.FAILED
