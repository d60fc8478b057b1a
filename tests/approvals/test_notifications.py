"""Telling reviewers: an e-mail to each assignee with the deep link, after the commit; and the
kind's signed question webhook, through the webhooks app's outbox, signing and retries."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.core import mail
from django.test import override_settings

from approvals.services import question_link, question_notify, questions_expire_due
from tests.approvals.conftest import answer_group, member_of, paused_on
from tests.conftest import make_user
from tests.webhooks.conftest import receiver  # noqa: F401 (the fixture)
from webhooks.models import Webhook, WebhookDelivery
from webhooks.services import webhook_create, webhook_deliver

pytestmark = pytest.mark.django_db


def with_email(username: str, **kwargs):
    user = make_user(username, **kwargs)
    user.email = f"{username}@example.com"
    user.save(update_fields=["email"])
    return user


def test_opening_a_question_sends_the_email_task_after_the_commit(django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr("approvals.tasks.question_notification_send.delay", lambda *args: sent.append(args))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        _, question = paused_on({})
    assert sent == []  # nothing before the commit
    for callback in callbacks:
        callback()
    assert sent == [(str(question.pk), "open")]


@override_settings(PUBLIC_URL="https://jobs.example.com")
def test_each_assignee_gets_an_email_with_the_deep_link():
    rita, sam = with_email("rita", reviewer=True), with_email("sam", reviewer=True)
    with_email("nosy")  # not a reviewer: not told
    make_user("mute", reviewer=True)  # no address
    owner = with_email("owner", reviewer=True)  # submitted it: may not answer, so not told
    _, question = paused_on({"prompt": "Pay invoice 42?", "details": {"amount": "99 EUR"}, "timeout": 3600},
                            owner=owner)
    assert question_notify(question_id=question.pk) == 2
    assert sorted(message.to[0] for message in mail.outbox) == [rita.email, sam.email]
    message = mail.outbox[0]
    link = f"https://jobs.example.com/admin/approvals/question/{question.pk}/change/"
    assert question_link(question) == link
    assert "Pay invoice 42?" in message.subject and link in message.body
    assert "amount: 99 EUR" in message.body and "Deadline:" in message.body and "fail the job" in message.body


def test_an_escalation_tells_the_new_assignees(django_capture_on_commit_callbacks, monkeypatch):
    boss = member_of(answer_group("managers"), "boss")
    boss.email = "boss@example.com"
    boss.save()
    sent = []
    monkeypatch.setattr("approvals.tasks.question_notification_send.delay", lambda *args: sent.append(args))
    _, question = paused_on({"timeout": 1, "on_timeout": {"action": "escalate", "to": "group:managers"}})
    from datetime import timedelta

    from django.utils import timezone

    with django_capture_on_commit_callbacks(execute=True):
        questions_expire_due(now=timezone.now() + timedelta(minutes=1))
    assert sent == [(str(question.pk), "escalated")]
    assert question_notify(question_id=question.pk, action="escalated") == 1
    assert mail.outbox[0].to == ["boss@example.com"] and mail.outbox[0].subject.startswith("[test.ask] Escalated")


def test_no_email_once_the_question_is_answered(reviewer):
    from approvals.services import question_answer

    with_email("rita", reviewer=True)
    _, question = paused_on({})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    assert question_notify(question_id=question.pk) == 0 and mail.outbox == []


@override_settings(APPROVALS_WEBHOOK_SECRET="kind-secret")
def test_the_kinds_webhook_is_signed_and_delivered(kind_options, receiver):  # noqa: F811
    kind_options("test.ask", notify_webhook=receiver.url)
    job, question = paused_on({"prompt": "Ship it?"})
    delivery = WebhookDelivery.objects.get()
    hook = delivery.webhook
    assert hook.owner is None and hook.url == receiver.url and hook.events == ["question"]
    assert delivery.event == "question" and delivery.payload["action"] == "open"
    assert delivery.payload["question"]["id"] == str(question.pk)
    assert delivery.payload["question"]["url"].endswith(f"/admin/approvals/question/{question.pk}/change/")
    assert webhook_deliver(delivery_id=delivery.pk) == "delivered"
    got = receiver.received[0]
    expected = hmac.new(b"kind-secret", f"{got['headers']['X-Webhook-Timestamp']}.".encode() + got["body"],
                        hashlib.sha256).hexdigest()
    assert got["headers"]["X-Webhook-Signature"] == f"sha256={expected}"
    assert got["headers"]["X-Webhook-Event"] == "job.question"
    assert json.loads(got["body"])["question"]["prompt"] == "Ship it?"


@override_settings(APPROVALS_WEBHOOK_SECRET="kind-secret")
def test_a_failing_kind_webhook_is_retried_with_backoff(kind_options, receiver):  # noqa: F811
    receiver.status = 500
    kind_options("test.ask", notify_webhook=receiver.url)
    paused_on({})
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery_id=delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.response_status == 500 and delivery.next_attempt_at is not None


def test_without_a_secret_the_kinds_webhook_is_not_sent(kind_options, receiver):  # noqa: F811
    kind_options("test.ask", notify_webhook=receiver.url)
    paused_on({})
    assert not WebhookDelivery.objects.exists() and not Webhook.objects.exists()


def test_an_owner_may_subscribe_to_question_events(submitter, receiver):  # noqa: F811
    webhook_create(owner=submitter, url=receiver.url, events=["question"])
    paused_on({}, owner=submitter)
    delivery = WebhookDelivery.objects.get(event="question")
    assert delivery.payload["event"] == "job.question" and delivery.payload["question"]["key"] == "q"
