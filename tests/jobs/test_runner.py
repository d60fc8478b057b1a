"""One run of a job, called in-process (the proof with a real worker is in test_end_to_end)."""

import pytest

from approvals.models import Question
from approvals.services import question_answer
from demo.services import step_runs
from jobs.models import Job
from jobs.runner import job_execute
from jobs.runtime import JobContext
from jobs.services import job_cancel, job_claim, job_submit
from tests.support.commit import dispatches

pytestmark = pytest.mark.django_db
S = Job.Status


def events(job):
    return [(e.type, e.step, e.status) for e in Job.objects.get(pk=job.pk).events.order_by("seq")]


def test_noop_completes_with_its_events():
    job, _ = job_submit(kind="demo.noop", input={})
    assert job_execute(job_id=job.pk) == "completed"
    job.refresh_from_db()
    assert job.status == S.COMPLETED and job.result == {} and job.progress_fraction == 1.0
    assert events(job) == [("status", "", "pending"), ("status", "", "processing"), ("status", "", "completed")]


def test_a_second_delivery_does_nothing():
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 2})
    assert job_execute(job_id=job.pk) == "completed"
    assert job_execute(job_id=job.pk) == "skipped"
    job.refresh_from_db()
    assert job.attempts == 1 and job.result["step_runs"] == {"1": 1, "2": 1}


def test_review_pauses_with_an_open_question_and_resumes_on_the_answer(reviewer, django_capture_on_commit_callbacks):
    job, _ = job_submit(kind="demo.review", input={"document": "Q3 report"})
    assert job_execute(job_id=job.pk) == "paused"
    question = Question.objects.get(job=job)
    assert question.status == "open" and question.key == "approve" and question.details == {"document": "Q3 report"}
    with django_capture_on_commit_callbacks() as callbacks:
        question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, channel="api")
    assert len(dispatches(callbacks)) == 1  # the job's dispatch
    assert Job.objects.get(pk=job.pk).status == S.PENDING
    assert job_execute(job_id=job.pk) == "completed"
    job.refresh_from_db()
    assert job.result == {"approved": True, "reviewer": "reviewer"}
    assert events(job) == [
        ("status", "", "pending"), ("status", "", "processing"), ("question", "approve", "open"),
        ("status", "", "paused"), ("question", "approve", "answered"), ("status", "", "pending"),
        ("status", "", "processing"), ("status", "", "completed"),
    ]


def test_errors_retry_with_backoff_then_fail(django_capture_on_commit_callbacks):
    job, _ = job_submit(kind="test.flaky", input={"fail_times": 5})
    for attempt in (1, 2):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            assert job_execute(job_id=job.pk) == "pending"
        job.refresh_from_db()
        assert job.attempts == attempt and job.error["code"] == "exception"
        assert "planned failure on attempt" in job.error["message"] and job.run_after is not None
        assert len(dispatches(callbacks)) == 1
        Job.objects.filter(pk=job.pk).update(run_after=None)  # the back-off has passed (a claim waits for it)
    assert job_execute(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.status == S.FAILED and job.attempts == 3 and job.finished_at
    # The finished step ran once; the code outside it ran on every attempt (the replay rule).
    assert step_runs(job_id=job.pk) == {"a": 1, "body": 3}


def test_job_failure_fails_at_once_with_its_code():
    job, _ = job_submit(kind="test.refuse", input={})
    assert job_execute(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.error == {"code": "bad_data", "message": "the input data cannot be processed"} and job.attempts == 1


def test_a_changed_question_fails_the_job(reviewer):
    job, _ = job_submit(kind="test.ask_changing", input={"prompt": "first"})
    job_execute(job_id=job.pk)
    question_answer(question_id=Question.objects.get(job=job).pk, user=reviewer, answer={"approved": True})
    Job.objects.filter(pk=job.pk).update(input={"prompt": "second"})
    assert job_execute(job_id=job.pk) == "failed"
    assert Job.objects.get(pk=job.pk).error["code"] == "question_changed"


def test_checkpointed_steps_are_not_run_again():
    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 3})
    claimed = job_claim(job_id=job.pk)
    ctx = JobContext(claimed)
    assert ctx.step("1", lambda: {"step": 1}) == {"step": 1}
    again = JobContext(Job.objects.get(pk=job.pk))
    assert again.step("1", lambda: pytest.fail("a finished step ran again")) == {"step": 1}
    assert events(job)[-3:] == [("step", "1", "started"), ("step", "1", "completed"), ("step", "1", "skipped")]


def test_a_cancelled_run_stops_at_its_next_ctx_call_and_stays_cancelled():
    from jobs.events import RunLost

    job, _ = job_submit(kind="demo.sleep", input={"seconds": 0, "steps": 3})
    ctx = JobContext(job_claim(job_id=job.pk))
    job_cancel(job_id=job.pk)
    with pytest.raises(RunLost):
        ctx.progress(0.5, "half")
    assert Job.objects.get(pk=job.pk).status == S.CANCELLED


def test_step_results_must_be_json():
    job, _ = job_submit(kind="demo.noop", input={})
    ctx = JobContext(job_claim(job_id=job.pk))
    from jobs.runtime import JobFailure

    with pytest.raises(JobFailure, match="not JSON"):
        ctx.step("bad", lambda: object())
