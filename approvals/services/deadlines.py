"""Deadlines: beat finds the open questions past `expires_at` and applies each one's `on_timeout`
policy as the system, with a ledger row (actor none, channel `system`)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from approvals.models import Decision, Question
from approvals.policies import policy_describe
from approvals.services.answering import question_settle
from approvals.services.asking import question_assign, questions_cancel_for_job
from approvals.services.ledger import decision_record
from approvals.services.notifications import question_announce
from jobs.clock import database_now
from jobs.conflicts import retry_on_conflict
from jobs.errors import InvalidTransition
from jobs.events import event_append
from jobs.models import Job
from jobs.services import job_cancel, job_fail_suspended, job_lock
from jobs.timestamps import iso_utc

logger = logging.getLogger(__name__)


def questions_expire_due(*, now: datetime | None = None, limit: int = 200) -> int:
    """Apply the deadline policy of every open question whose deadline has passed (at most
    `limit`, earliest first). Run by beat; safe to run in several processes at once (each
    question is taken under its row lock, skipping rows another process holds). Returns how
    many were handled. `now` (a test's) defaults to the database's time, the clock deadlines are
    written with (`jobs.clock`)."""
    now = now or database_now()
    due = list(
        Question.objects.filter(status=Question.Status.OPEN, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", flat=True)[:limit]
    )
    handled = 0
    for question_id in due:
        try:
            handled += question_expire(question_id=question_id, now=now) is not None
        except Exception:  # one broken question must not stop the others
            logger.exception("applying the deadline of question %s failed", question_id)
    return handled


@retry_on_conflict
def question_expire(*, question_id: Any, now: datetime | None = None) -> str | None:
    """Apply the `on_timeout` policy of one question if it is still open and past its deadline;
    return the action taken, or None (answered meanwhile, not due, or locked by another beat)."""
    now = now or database_now()
    with transaction.atomic():
        # The job's row first, then the question (the platform's one lock order).
        job_id = (
            Question.objects.filter(pk=question_id, status=Question.Status.OPEN, expires_at__lte=now)
            .values_list("job_id", flat=True).first()
        )
        if job_id is None:
            return None
        job_lock(job_id=job_id)
        question = (
            Question.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("job")
            .filter(pk=question_id, status=Question.Status.OPEN, expires_at__lte=now)
            .first()
        )
        if question is None:
            return None
        policy = question.on_timeout or {"action": "fail"}
        action = policy.get("action", "fail")
        if action == "escalate":
            _escalate(question, policy, now)
            return action
        if action == "default":
            comment = "the deadline passed; answered with the default"
            question_settle(
                question=question, answer=policy.get("answer"), user=None, comment=comment,
                channel=Decision.Channel.SYSTEM, event_status="expired",
                event_message={"on_timeout": "default", "answer": policy.get("answer"), "by": "system"},
                decision={"question": question, "kind": Decision.Kind.EXPIRED, "channel": Decision.Channel.SYSTEM,
                          "answer": policy.get("answer"), "comment": comment, "detail": {"on_timeout": "default"}},
            )
            return action
        _close_and_stop_job(question, action)
        return action


def _close_and_stop_job(question: Question, action: str) -> None:
    """Expire the question and fail (or cancel) its paused job. Caller holds the row lock."""
    job = question.job
    question.status = Question.Status.EXPIRED
    question.save(update_fields=["status"])
    what = "the job was cancelled" if action == "cancel" else "the job failed"
    decision_record(question=question, kind=Decision.Kind.EXPIRED, channel=Decision.Channel.SYSTEM,
                    comment=f"the deadline passed; {what}", detail={"on_timeout": action})
    event_append(job_id=job.pk, type="question", step=question.key, status="expired", message={"on_timeout": action})
    try:
        if action == "cancel":
            job_cancel(job_id=job.pk, channel=Decision.Channel.SYSTEM)
        else:
            job_fail_suspended(job_id=job.pk, code="question_expired", from_=[Job.Status.PAUSED],
                               message=f"nobody answered question {question.key!r} before its deadline")
            questions_cancel_for_job(job=job, channel=Decision.Channel.SYSTEM)
    except InvalidTransition as exc:
        # A question stays open only while its job waits for it; a job already finished keeps
        # its outcome, and the question is closed all the same.
        logger.warning("question %s expired but its job could not be stopped: %s", question.pk, exc)


def _escalate(question: Question, policy: dict[str, Any], now: datetime) -> None:
    """Reassign the question to the escalation's assignees with its new deadline and policy."""
    timeout = policy.get("timeout")
    question.expires_at = now + timedelta(seconds=timeout) if timeout else None
    question.on_timeout = policy.get("then") if timeout else None
    question.save(update_fields=["expires_at", "on_timeout"])
    question_assign(question=question, assignees={"users": policy.get("users"), "groups": policy.get("groups")})
    detail = {"to": policy.get("to"), "expires_at": iso_utc(question.expires_at)}
    if question.expires_at:
        detail["then"] = policy_describe(question.on_timeout)
    decision_record(question=question, kind=Decision.Kind.ESCALATED, channel=Decision.Channel.SYSTEM,
                    comment=f"the deadline passed; reassigned to {', '.join(policy.get('to') or [])}", detail=detail)
    event_append(job_id=question.job_id, type="question", step=question.key, status="escalated", message=detail)
    question_announce(question=question, job=question.job, action="escalated")
