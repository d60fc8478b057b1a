"""A move of an owned job whose owner has no active webhook is ONE statement, as an ownerless
job's is: the owner's webhooks are looked for in the move's own statement
(`TransitionHook.needed_when`), not by a transaction and a read of their own. Where the owner has
one, the move takes its transaction and the delivery is queued with it, as before."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.errors import InvalidTransition
from jobs.models import Job
from jobs.services import job_cancel, job_claim, job_submit
from jobs.services.moves import job_complete
from tests.conftest import make_user
from webhooks.models import WebhookDelivery
from webhooks.services import webhook_create

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-statement moves"),
    pytest.mark.django_db(transaction=True),  # outside any transaction, as a worker moves a job
]


@pytest.fixture
def no_transaction(monkeypatch):
    """Fails the test if a move opens a transaction for its hooks."""
    from jobs.services import transitions

    original = transitions._transition_transaction

    def refuse(*, alone):
        if not alone:
            raise AssertionError("the move took a transaction for its hooks")
        return original(alone=alone)

    monkeypatch.setattr(transitions, "_transition_transaction", refuse)


def claimed(owner) -> Job:
    job, _ = job_submit(kind="demo.noop", owner=owner)
    return job_claim(job_id=job.pk)


def test_an_owned_jobs_outcome_is_one_statement_when_its_owner_has_no_webhook(no_transaction):
    owner = make_user("plain")
    webhook_create(owner=make_user("other"), url="https://hooks.example.com/x", events=["completed"])
    job = claimed(owner)
    with CaptureQueriesContext(connection) as outcome:
        done = job_complete(job=job, result={"ok": True})
    statements = [query["sql"] for query in outcome.captured_queries]
    assert len(statements) == 1, statements
    assert 'NOT EXISTS(SELECT 1 AS "a" FROM "webhooks_webhook"' in statements[0], statements[0]
    assert done.status == "completed" and done.result == {"ok": True}
    assert not WebhookDelivery.objects.exists()
    assert [e.status for e in Job.objects.get(pk=job.pk).events.order_by("seq")] == [
        "pending", "processing", "completed",
    ]


def test_an_inactive_webhook_needs_no_transaction_either(no_transaction):
    owner = make_user("paused-hook")
    hook = webhook_create(owner=owner, url="https://hooks.example.com/x", events=["completed"])
    hook.is_active = False
    hook.save(update_fields=["is_active"])
    job_complete(job=claimed(owner), result=None)
    assert not WebhookDelivery.objects.exists()


def test_an_owner_with_a_webhook_gets_the_delivery_queued_with_the_move():
    owner = make_user("hooked")
    hook = webhook_create(owner=owner, url="https://hooks.example.com/x", events=["completed"])
    job = claimed(owner)
    with CaptureQueriesContext(connection) as outcome:
        done = job_complete(job=job, result={"ok": True})
    statements = [query["sql"] for query in outcome.captured_queries]
    # The fenced statement matched nothing; then, in one transaction, the move, the owner's
    # webhooks and the delivery.
    assert statements[0].startswith("WITH") and "NOT EXISTS" in statements[0], statements
    assert statements[1] == "BEGIN" and statements[-1] == "COMMIT", statements
    assert any('INSERT INTO "webhooks_webhookdelivery"' in sql for sql in statements), statements
    delivery = WebhookDelivery.objects.get()
    assert (delivery.webhook_id, delivery.job_id, delivery.event) == (hook.pk, job.pk, "completed")
    assert done.status == "completed"
    assert Job.objects.get(pk=job.pk).event_seq == 3  # one `completed` event, not two


def test_a_refused_move_of_an_owned_job_still_names_the_status():
    owner = make_user("refused")
    job = claimed(owner)
    job_cancel(job_id=job.pk)
    with pytest.raises(InvalidTransition, match="cancelled"):
        job_complete(job=job, result=None)
    assert Job.objects.get(pk=job.pk).status == "cancelled"
    assert not WebhookDelivery.objects.exists()
