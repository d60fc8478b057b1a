"""Webhooks: deliveries queued with the status change, signed, retried with back-off, logged."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from jobs.clock import db_now
from jobs.runner import job_execute
from jobs.services import job_cancel, job_submit
from tests.conftest import make_user
from webhooks.models import Webhook, WebhookDelivery
from webhooks.services import (
    webhook_create,
    webhook_deliver,
    webhook_deliveries_send_due,
    webhook_delivery_retry_now,
    webhook_sign,
)

pytestmark = pytest.mark.django_db


def verify(secret: str, headers: dict, body: bytes) -> bool:
    """What a receiver does."""
    expected = hmac.new(secret.encode(), f"{headers['X-Webhook-Timestamp']}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(headers["X-Webhook-Signature"], f"sha256={expected.hexdigest()}")


@pytest.fixture
def hook(submitter, receiver) -> Webhook:
    return webhook_create(owner=submitter, url=receiver.url, events=["completed", "failed", "paused", "cancelled"])


def test_a_completed_job_queues_one_delivery_per_matching_webhook(submitter, hook, receiver):
    webhook_create(owner=submitter, url=receiver.url, events=["failed"])  # not interested
    webhook_create(owner=make_user("other"), url=receiver.url, events=["completed"])  # not their job
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    delivery = WebhookDelivery.objects.get()
    assert (delivery.webhook, delivery.job_id) == (hook, job.pk)
    assert (delivery.event, delivery.status) == ("completed", "pending")
    assert delivery.payload["event"] == "job.completed"
    assert delivery.payload["job"]["id"] == str(job.pk) and delivery.payload["job"]["status"] == "completed"


def test_paused_and_cancelled_are_delivered_too(submitter, hook):
    job, _ = job_submit(kind="demo.review", input={"document": "d"}, owner=submitter)
    job_execute(job_id=job.pk)
    job_cancel(job_id=job.pk)
    assert list(WebhookDelivery.objects.order_by("created_at").values_list("event", flat=True)) == [
        "paused", "cancelled",
    ]


def test_an_inactive_webhook_and_a_job_without_owner_queue_nothing(submitter, hook):
    job_submit(kind="demo.noop")
    Webhook.objects.update(is_active=False)
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    assert not WebhookDelivery.objects.exists()


def test_a_delivery_is_posted_signed_over_timestamp_and_body(submitter, hook, receiver):
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery_id=delivery.pk) == "delivered"
    [request] = receiver.received
    assert verify(hook.secret, request["headers"], request["body"])
    assert not verify("another secret", request["headers"], request["body"])
    body = json.loads(request["body"])
    assert body["id"] == str(delivery.pk) and body["event"] == "job.completed" and body["job"]["id"] == str(job.pk)
    assert request["headers"]["X-Webhook-Event"] == "job.completed"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("delivered", 1, 200)
    assert delivery.delivered_at is not None
    assert webhook_deliver(delivery_id=delivery.pk) == "skipped"  # a duplicate message sends nothing
    assert len(receiver.received) == 1


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body():
    expected = hmac.new(b"k", b"1700000000.{}", hashlib.sha256).hexdigest()
    assert webhook_sign(secret="k", timestamp=1700000000, body=b"{}") == f"sha256={expected}"


@override_settings(WEBHOOK_MAX_ATTEMPTS=3, WEBHOOK_RETRY_BASE=10, WEBHOOK_RETRY_MAX=100)
def test_a_failing_receiver_is_retried_with_backoff_then_the_delivery_fails(submitter, hook, receiver):
    receiver.status = 500
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    delivery = WebhookDelivery.objects.get()
    waits = []
    for attempt in (1, 2):
        before = timezone.now()
        assert webhook_deliver(delivery_id=delivery.pk) == "pending"
        delivery.refresh_from_db()
        assert delivery.attempts == attempt and delivery.response_status == 500
        assert delivery.last_error.startswith("HTTP 500")
        waits.append((delivery.next_attempt_at - before).total_seconds())
        assert webhook_deliver(delivery_id=delivery.pk) == "skipped"  # not due yet
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=db_now())  # due: by the database's clock
    assert 5 <= waits[0] <= 10.5 and 10 <= waits[1] <= 20.5  # base * 2**(n-1), half of it jittered
    assert webhook_deliver(delivery_id=delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert delivery.status == "failed" and delivery.attempts == 3 and len(receiver.received) == 3

    webhook_delivery_retry_now(delivery=delivery)  # the admin's action: one more attempt
    receiver.status = 204
    assert webhook_deliver(delivery_id=delivery.pk) == "delivered"


def test_an_unreachable_receiver_is_logged_and_retried(submitter, settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_NETWORKS = True  # port 9 of this machine: nothing listens there
    webhook_create(owner=submitter, url="http://127.0.0.1:9/nothing-listens", events=["completed"])
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery_id=delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert "ConnectError" in delivery.last_error and delivery.response_status is None


def test_beat_sends_the_due_deliveries_only(submitter, hook, monkeypatch):
    sent = []
    monkeypatch.setattr("webhooks.tasks.webhook_delivery_attempt.delay", sent.append)
    for _ in range(2):
        job, _ = job_submit(kind="demo.noop", owner=submitter)
        job_execute(job_id=job.pk)
    later = WebhookDelivery.objects.first()
    WebhookDelivery.objects.filter(pk=later.pk).update(next_attempt_at=timezone.now() + timedelta(minutes=5))
    assert webhook_deliveries_send_due() == 1
    assert sent == [str(WebhookDelivery.objects.exclude(pk=later.pk).get().pk)]


def test_deliveries_are_sent_after_the_commit(submitter, hook, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr("webhooks.tasks.webhook_delivery_attempt.delay", sent.append)
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job_id=job.pk)
    assert sent == [str(WebhookDelivery.objects.get().pk)]
