"""What a wake may resume (issue 13, item 9): a callback, a due check or a person's "check now"
resumes a job only when it is `waiting` on that very wait; never a job paused on a question,
never a job that parked on another wait since."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job
from jobs.services import job_submit
from tests.support.runs import claim, finish, fresh, run
from waits.models import Wait
from waits.policy import CheckResult
from waits.services import wait_check_now, waits_resume_due, wake_token, wake_token_redeem

pytestmark = pytest.mark.django_db
S = Job.Status


def park_on(key: str):
    """A handler body that parks on the wait `key` (the service accepts, nothing is done yet)."""
    return lambda ctx: ctx.wait_for(key, submit=lambda token, url: f"ext-{key}", check=lambda _: CheckResult.pending())


def due_now(wait: Wait) -> None:
    Wait.objects.filter(pk=wait.pk).update(next_due_at=timezone.now() - timedelta(seconds=1))


@pytest.fixture
def moved_on():
    """A job that parked on wait `a`, was woken, and then parked on wait `b` (its handler took
    another path): `a` is still active and due."""
    job, _ = job_submit(kind="demo.noop", input={})
    assert run(job.pk, park_on("a")) == "waiting"
    a = Wait.objects.get(job=job, key="a")
    due_now(a)
    assert waits_resume_due() == 1
    assert run(job.pk, park_on("b")) == "waiting"
    assert fresh(job).status == S.WAITING
    b = Wait.objects.get(job=job, key="b")
    assert Wait.objects.get(pk=a.pk).is_active and Wait.objects.get(pk=a.pk).next_due_at < timezone.now()
    return job, a, b


def test_a_due_check_of_another_wait_does_not_resume_the_job(moved_on):
    job, a, b = moved_on
    seq = fresh(job).event_seq
    assert waits_resume_due() == 0
    assert fresh(job).status == S.WAITING and fresh(job).event_seq == seq
    due_now(b)
    assert waits_resume_due() == 1  # its own wait's check does
    assert fresh(job).status == S.PENDING


def test_a_callback_or_a_check_now_for_another_wait_does_not_resume_the_job(moved_on):
    job, a, b = moved_on
    wake_token_redeem(token=wake_token(a.token_salt))
    wait_check_now(wait_id=a.pk)
    assert fresh(job).status == S.WAITING
    wake_token_redeem(token=wake_token(b.token_salt))
    assert fresh(job).status == S.PENDING


def test_a_due_wait_or_its_callback_never_resumes_a_job_paused_on_a_question(reviewer):
    job, _ = job_submit(kind="demo.noop", input={})
    assert run(job.pk, park_on("a")) == "waiting"
    a = Wait.objects.get(job=job, key="a")
    wake_token_redeem(token=wake_token(a.token_salt))
    # The woken run asks a question instead of looking at `a` again: paused, `a` still active.
    ctx = claim(job.pk)
    assert finish(ctx, lambda ctx: ctx.ask("q", "Go on?")) == "paused"
    due_now(a)
    assert waits_resume_due() == 0
    wait_check_now(wait_id=a.pk)
    assert fresh(job).status == S.PAUSED
    assert fresh(job).suspended_on == "question:q"
