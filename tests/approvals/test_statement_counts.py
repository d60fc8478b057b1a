"""What an answer through the API costs PostgreSQL, counted: every statement is a round trip
between the answer and the job's resume (bench/shipped.py's answer→processing figure).

A move or an event that is one statement takes no savepoint of its own inside the request's
transaction (`jobs.events.one_statement_write`): that saved four round trips per answer."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.conftest import client_for
from tests.approvals.conftest import paused_on
from tests.conftest import make_user

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's one-statement moves"),
    pytest.mark.django_db,
]


def test_an_answer_through_the_api_takes_no_savepoint_beyond_the_requests_own(monkeypatch):
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    api = client_for(make_user("desk", reviewer=True))
    job, question = paused_on({})
    with CaptureQueriesContext(connection) as answer:
        response = api.post(f"/api/questions/{question.pk}/answer/", {"answer": {"approved": True}}, format="json")
    assert response.status_code == 200, response.content
    statements = [query["sql"] for query in answer.captured_queries]
    # The request's transaction is a savepoint inside the test's; in production it is BEGIN.
    assert sum(sql.startswith("SAVEPOINT") for sql in statements) == 1, statements
    # The view read the question already: its job is not looked up again before the lock.
    assert not any(sql.startswith('SELECT "approvals_question"."job_id"') for sql in statements), statements
    # 19, and one more when the token's `last_used_at` is due for its (throttled) update.
    assert len(statements) <= 20, "\n".join(sql[:120] for sql in statements)
    job.refresh_from_db()
    assert job.status == "pending"
