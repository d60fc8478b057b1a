"""Telling people: an e-mail to a question's assignees when it opens (or is escalated to them),
and a signed webhook delivery to the kind's `notify_webhook` (and to the job owner's webhooks
that want `question` events), through the `webhooks` app's outbox, signing and retries."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse

from approvals.models import Question
from approvals.policies import policy_describe
from approvals.rendering import details_text
from approvals.schemas import schema_summary
from approvals.selectors import ANSWER_PERMISSION, kinds_allowing_self_approval
from jobs.errors import UnknownKind
from jobs.models import Job
from jobs.registry import kind_get
from jobs.timestamps import iso_utc

logger = logging.getLogger(__name__)


def question_link(question: Question) -> str:
    """The deep link to the question's page in the admin (its answer form), under PUBLIC_URL."""
    return settings.PUBLIC_URL + reverse("admin:approvals_question_change", args=[question.pk])


def _question_payload(question: Question, action: str) -> dict[str, Any]:
    return {
        "action": action,
        "question": {
            "id": str(question.pk),
            "key": question.key,
            "prompt": question.prompt,
            "type": question.type,
            "schema": question.schema,
            "details": question.details,
            "assignees": question.assignee_names(),
            "required_approvals": question.required_approvals,
            "expires_at": iso_utc(question.expires_at),
            "round": question.round,
            "asked_again_because": question.asked_again_because or None,
            "url": question_link(question),
        },
    }


def question_announce(*, question: Question, job: Job, action: str) -> None:
    """Queue what tells people that `question` waits (`action`: open, reopened, escalated).

    Precondition: the caller is in the transaction that opened or reassigned the question. The
    webhook deliveries are rows of this transaction (an outbox); the e-mails go out from a task
    sent after the commit, so a rolled-back question never notifies anyone.
    """
    from webhooks.services import webhook_deliveries_enqueue, webhook_system_get

    try:
        url = kind_get(job.kind).notify_webhook
    except UnknownKind:
        url = None
    system = webhook_system_get(url=url, events=["question"]) if url else None
    webhook_deliveries_enqueue(
        job=job, event="question", extra=_question_payload(question, action), also=[system] if system else []
    )
    question_id = str(question.pk)
    transaction.on_commit(lambda: _notify_later(question_id, action), robust=True)


def _notify_later(question_id: str, action: str) -> None:
    from approvals.tasks import question_notification_send

    question_notification_send.delay(question_id, action)


def question_recipients(question: Question) -> list[Any]:
    """The active users who may answer `question` and have an e-mail address."""
    job = question.job
    users = (
        get_user_model()
        .objects.filter(is_active=True)
        .exclude(email="")
        .filter(Q(assigned_questions=question) | Q(groups__assigned_questions=question))
        .distinct()
        .order_by("username")
    )
    if job.owner_id is not None and job.kind not in kinds_allowing_self_approval():
        users = users.exclude(pk=job.owner_id)
    return [user for user in users if user.has_perm(ANSWER_PERMISSION)]


def question_notify(*, question_id: Any, action: str = "open") -> int:
    """E-mail the assignees of an open question, one message each, with the deep link to answer
    it. Returns how many were sent (0 once the question is no longer open)."""
    question = Question.objects.select_related("job").filter(pk=question_id, status=Question.Status.OPEN).first()
    if question is None:
        return 0
    recipients = question_recipients(question)
    if not recipients:
        logger.info("question %s has no assignee with an e-mail address to tell", question_id)
        return 0
    context = {
        "question": question,
        "job": question.job,
        "action": action,
        "link": question_link(question),
        "details_text": details_text(question.details) if question.details else "",
        "answer_summary": schema_summary(question.schema),
        "on_timeout": policy_describe(question.on_timeout) if question.expires_at else "",
        "asked_again": question.asked_again_text(),
    }
    subject = f"[{question.job.kind}] {'Escalated to you: ' if action == 'escalated' else ''}{question.prompt}"
    subject = " ".join(subject.split())[:150]
    body = render_to_string("approvals/question_email.txt", context)
    messages = [
        EmailMessage(subject=subject, body=body, from_email=settings.DEFAULT_FROM_EMAIL, to=[user.email])
        for user in recipients
    ]
    return get_connection().send_messages(messages) or 0
