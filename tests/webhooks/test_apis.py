"""The webhooks API and admin, and a delivery made by a real worker."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from jobs.runner import job_execute
from jobs.services import job_submit
from tests.api.conftest import client_for
from tests.support.processes import celery_worker, wait_until
from webhooks.models import Webhook, WebhookDelivery


@pytest.fixture
def api(submitter):
    return client_for(submitter)


@pytest.mark.django_db
def test_register_list_get_and_delete_a_webhook(api, other_api_factory):
    response = api.post("/api/webhooks/", {"url": "https://example.test/hook", "events": ["completed", "failed"]},
                        format="json")
    assert response.status_code == 201
    created = response.json()
    assert len(created["secret"]) == 64 and created["events"] == ["completed", "failed"]
    listed = api.get("/api/webhooks/").json()
    assert listed["count"] == 1 and "secret" not in listed["results"][0]
    assert "secret" not in api.get(f"/api/webhooks/{created['id']}/").json()
    other = other_api_factory()
    assert other.get(f"/api/webhooks/{created['id']}/").status_code == 404
    assert other.delete(f"/api/webhooks/{created['id']}/").status_code == 404
    assert api.delete(f"/api/webhooks/{created['id']}/").status_code == 204
    assert not Webhook.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "https://example.test/hook", "events": ["started"]}, "events.0"),
        ({"url": "https://example.test/hook", "events": []}, "events"),
        ({"url": "ftp://example.test/hook", "events": ["failed"]}, "url"),
        ({"url": "not a url", "events": ["failed"]}, "url"),
    ],
)
def test_a_bad_webhook_is_400_naming_the_field(api, body, field):
    response = api.post("/api/webhooks/", body, format="json")
    assert response.status_code == 400 and response.json()["field"] == field


@pytest.mark.django_db
def test_the_delivery_log_of_a_webhook(api, submitter):
    hook = api.post("/api/webhooks/", {"url": "https://example.test/h", "events": ["completed"]}, format="json").json()
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    log = api.get(f"/api/webhooks/{hook['id']}/deliveries/").json()
    assert log["count"] == 1
    assert log["results"][0]["job"] == str(job.pk) and log["results"][0]["status"] == "pending"


@pytest.mark.django_db
def test_the_admin_shows_deliveries_and_sends_one_again(client, superuser, submitter, monkeypatch):
    from webhooks.services import webhook_create

    webhook_create(owner=submitter, url="https://example.test/h", events=["completed"])
    job, _ = job_submit(kind="demo.noop", owner=submitter)
    job_execute(job_id=job.pk)
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.update(status="failed", attempts=8)
    client.force_login(superuser)
    page = client.get("/admin/webhooks/webhookdelivery/").content.decode()
    assert "example.test" in page and "failed" in page
    assert client.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/").status_code == 200
    client.post("/admin/webhooks/webhookdelivery/", {"action": "retry_now", "_selected_action": [delivery.pk]})
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.attempts == 7


@pytest.fixture
def on_premise_worker(only_own_workers):
    """A real worker of a deployment that allows private webhook targets (the receiver listens on
    127.0.0.1); the session's worker, which keeps the default policy, is stopped meanwhile."""
    process = celery_worker(name="on-premise-worker", env={"WEBHOOKS_ALLOW_PRIVATE_NETWORKS": "true"}).start()
    yield process
    process.stop()


@pytest.mark.worker
def test_a_real_worker_delivers_a_signed_webhook_when_a_submitted_job_completes(on_premise_worker, submitter,
                                                                                 receiver):
    api = client_for(submitter)
    secret = api.post("/api/webhooks/", {"url": receiver.url, "events": ["completed"]}, format="json").json()["secret"]
    job = api.post("/api/jobs/", {"kind": "demo.noop"}, format="json").json()
    wait_until(lambda: receiver.received, timeout=30, message="no webhook delivery arrived")
    [request] = receiver.received
    signed = hmac.new(secret.encode(), f"{request['headers']['X-Webhook-Timestamp']}.".encode() + request["body"],
                      hashlib.sha256).hexdigest()
    assert request["headers"]["X-Webhook-Signature"] == f"sha256={signed}"
    assert json.loads(request["body"])["job"]["id"] == job["id"]
    wait_until(lambda: WebhookDelivery.objects.filter(status="delivered").exists(), timeout=10)
