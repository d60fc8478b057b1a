"""How `jobs.testing.run_kind` plays questions in-process (a harness driver, registered by
`approvals.extensions`): a paused job's open question gets the test's answer through
`question_answer`, the service the admin and the API use; without one, the test clock moves past
the question's deadline and beat's deadline pass applies its policy."""

from __future__ import annotations

from typing import Any

from approvals.models import Decision, Question
from approvals.schemas import QuestionType
from approvals.services import question_answer, questions_expire_due
from jobs import typed
from jobs.models import Job
from jobs.testing import EXPIRE, Answer, HarnessError


def _as_child(job: Job) -> str:
    return f" (child {job.spawn_key!r})" if job.parent_id else ""


def answer_paused_job(job: Job, run: Any) -> bool:
    """Answer (or let expire) the open question `job` is paused on; False if it has none."""
    question = Question.objects.filter(job=job, status=Question.Status.OPEN).order_by("opened_at", "pk").first()
    if question is None:
        return False
    given = run.answer_for(question.key, question)
    if given is EXPIRE:
        if question.expires_at is None:
            raise HarnessError(
                f"{job.kind} {job.pk}{_as_child(job)} is paused on question {question.key!r} ({question.prompt!r}), "
                f"which has no deadline to let pass, and the test gives no answer: "
                f"pass answers={{{question.key!r}: ...}}"
            )
        run.clock.advance_to(question.expires_at)
        questions_expire_due()
        return True
    votes = given if isinstance(given, list) and given and all(isinstance(v, Answer) for v in given) else None
    if votes is None:
        one = given if isinstance(given, Answer) else Answer(given)
        # A quorum needs that many distinct reviewers: the same answer from harness, harness-2, …
        needed = question.required_approvals if question.type == QuestionType.APPROVAL else 1
        votes = [one if index == 0 else Answer(one.value, by=f"harness-{index + 1}", comment=one.comment)
                 for index in range(max(needed - question.approvals_so_far(), 1))]
    for vote in votes:
        question_answer(question_id=question.pk, user=run.user(vote.by), answer=typed.to_json(vote.value),
                        comment=vote.comment, channel=Decision.Channel.API)
        question.refresh_from_db(fields=["status"])
        if question.status != Question.Status.OPEN:
            break
    return True
