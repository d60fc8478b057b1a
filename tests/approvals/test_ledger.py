"""The decision ledger: a row for every answer, vote, expiry, escalation, cancellation and
re-opening; never updated or deleted (model, queryset, admin and, on PostgreSQL, a trigger);
kept when a job is retried. And the rule for changed questions (`question_changed`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models.deletion import ProtectedError
from django.db.utils import DatabaseError
from django.test import RequestFactory, override_settings

from approvals.models import AppendOnly, Decision, Question
from approvals.services import question_answer, request_client_address
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_cancel, job_retry, job_submit
from tests.approvals.conftest import paused_on

pytestmark = pytest.mark.django_db
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def decision(reviewer) -> Decision:
    _, question = paused_on({})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True}, comment="ok",
                    channel="api", client_address="10.1.2.3")
    return Decision.objects.get(question=question)


def test_an_answer_is_a_row_with_who_where_and_what_was_shown(decision, reviewer):
    question = decision.question
    assert (decision.kind, decision.actor, decision.actor_name, decision.channel) == (
        "approved", reviewer, "reviewer", "api")
    assert decision.answer == {"approved": True} and decision.comment == "ok"
    assert decision.client_address == "10.1.2.3" and decision.digest == question.digest
    assert decision.job_id == question.job_id and decision.round == 1


def test_rows_are_never_updated_or_deleted_through_the_orm(decision):
    decision.comment = "rewritten"
    with pytest.raises(AppendOnly):
        decision.save()
    with pytest.raises(AppendOnly):
        decision.delete()
    with pytest.raises(AppendOnly):
        Decision.objects.filter(pk=decision.pk).update(comment="rewritten")
    with pytest.raises(AppendOnly):
        Decision.objects.all().delete()
    with pytest.raises(ProtectedError):  # deleting its job would take the ledger with it
        Job.objects.filter(pk=decision.job_id).delete()
    assert Decision.objects.get(pk=decision.pk).comment == "ok"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the database trigger is PostgreSQL's")
def test_postgresql_refuses_updates_and_deletes_too(decision):
    for sql in ("UPDATE approvals_decision SET comment = 'x' WHERE id = %s",
                "DELETE FROM approvals_decision WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [decision.pk])
    assert Decision.objects.get(pk=decision.pk).comment == "ok"


def test_cancelling_a_job_records_who_cancelled_each_open_question(reviewer):
    job, question = paused_on({})
    job_cancel(job_id=job.pk, actor=reviewer, channel="api")
    row = Decision.objects.get(question=question)
    assert (row.kind, row.actor_name, row.channel) == ("cancelled", "reviewer", "api")


def test_a_retried_job_asks_again_and_keeps_the_ledger(reviewer):
    job, question = paused_on({})
    job_cancel(job_id=job.pk)
    before = list(Decision.objects.filter(question=question).values_list("pk", "kind", "round"))
    assert [(kind, round_) for _, kind, round_ in before] == [("cancelled", 1)]
    job_retry(job_id=job.pk)
    job_execute(job_id=job.pk)
    question.refresh_from_db()
    assert Job.objects.get(pk=job.pk).status == "paused"
    assert question.status == "open" and question.round == 2 and question.answer is None
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    rows = list(Decision.objects.filter(question=question).values_list("pk", "kind", "round"))
    assert rows[: len(before)] == before  # the old rows, untouched
    assert [(kind, round_) for _, kind, round_ in rows[len(before):]] == [("reopened", 2), ("approved", 2)]
    job_execute(job_id=job.pk)
    assert Job.objects.get(pk=job.pk).result["round"] == 2


def test_an_expired_question_is_asked_again_when_its_failed_job_is_retried():
    from datetime import timedelta

    from django.utils import timezone

    from approvals.services import questions_expire_due

    job, question = paused_on({"timeout": 30})
    questions_expire_due(now=timezone.now() + timedelta(minutes=5))
    assert Job.objects.get(pk=job.pk).error["code"] == "question_expired"
    job_retry(job_id=job.pk)
    job_execute(job_id=job.pk)
    question.refresh_from_db()
    assert question.status == "open" and question.round == 2 and question.expires_at > timezone.now()


def test_a_changed_question_fails_the_job_and_never_reuses_the_answer(reviewer):
    job, _ = job_submit(kind="test.ask_changing", input={"prompt": "Pay 10 EUR?"})
    job_execute(job_id=job.pk)
    question = Question.objects.get(job=job)
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    Job.objects.filter(pk=job.pk).update(input={"prompt": "Pay 10,000 EUR?"})  # the code now asks otherwise
    job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "question_changed" and job.result is None
    decision = Decision.objects.get(question=question)
    assert decision.digest == question.digest  # what the reviewer approved, for the record


def test_the_readme_documents_question_changed_for_reviewers():
    text = README.read_text()
    section = text[text.index("## For reviewers and job authors: questions"):]
    assert "`question_changed`" in section.split("\n## ")[0]


def test_the_client_address_trusts_x_forwarded_for_only_when_told():
    # The right-most hop past the trusted proxy: the left-most is whatever the client wrote
    # (tests/security/test_client_address.py).
    request = RequestFactory().post("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7")
    assert request_client_address(request) == "10.0.0.1"
    with override_settings(TRUSTED_PROXY_COUNT=1):
        assert request_client_address(request) == "203.0.113.7"
        garbage = RequestFactory().post("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="<script>")
        assert request_client_address(garbage) == "10.0.0.1"
