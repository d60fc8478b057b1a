"""What an answer and a submit through the API cost PostgreSQL, counted: every statement is a
round trip between the answer and the job's resume (bench/shipped.py's answer→processing
figure), or in the API's request rate.

A move or an event that is one statement takes no savepoint of its own inside the request's
transaction (`jobs.events.one_statement_write`): that saved four round trips per answer."""

from __future__ import annotations

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from jobs.models import Job
from jobs.timestamps import iso_utc
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
    # The view's read of the question (may the caller see it?) is of its job's id alone, and the
    # job is not looked up again before the lock: the question's prompt, schema and details (a
    # document under review) are read once, under the lock, and the job's JSON (its input: the
    # document again) not with it. (The job's move reads the job back whole: a status move's job
    # goes to the jobs' feed, input and all, when someone follows it.)
    first_read = [sql for sql in statements if sql.startswith('SELECT "approvals_question"."job_id"')]
    assert len(first_read) == 1 and '"details"' not in first_read[0], statements
    assert sum('"approvals_question"."details"' in sql for sql in statements) == 1, statements
    assert not any('"jobs_job"."input"' in sql for sql in statements), statements
    # The user's permissions in one query (accounts.backends), not two; whether the question is
    # assigned to them read with the question under its lock, not on its own; the answer's time
    # is its ledger row's, not asked for; the round's votes counted once.
    assert sum('"auth_permission"' in sql for sql in statements) == 1, statements
    assert not any(sql.startswith('SELECT 1 AS "a" FROM "approvals_question"') for sql in statements), statements
    assert "SELECT statement_timestamp()" not in statements, statements
    assert sum('FROM "approvals_decision"' in sql and "COUNT" in sql for sql in statements) == 1, statements
    # ...and read with the question under the lock, not in a statement of its own.
    assert any(sql.startswith('SELECT "approvals_question"') and sql.endswith("FOR UPDATE OF \"approvals_question\"")
               and "COUNT" in sql for sql in statements), statements
    # The ledger row and the question's answer are one statement (approvals.services.ledger),
    # its time the answer's.
    assert sum(sql.startswith('WITH d AS (INSERT INTO "approvals_decision"') for sql in statements) == 1, statements
    assert not any(sql.startswith(('INSERT INTO "approvals_decision"', 'UPDATE "approvals_question"'))
                   for sql in statements), statements
    # The question's event is written by the job's move, in its statement: one UPDATE of the job.
    assert sum(sql.startswith('WITH j AS (UPDATE "jobs_job"') for sql in statements) == 1, statements
    # 10 (the response counts no votes: the answer just did; it reads the assignees, users and
    # groups, in one statement), and one more when the token's `last_used_at` is due for its
    # (throttled) update.
    assert len(statements) <= 11, "\n".join(sql[:120] for sql in statements)
    assert response.json()["approvals"] == 1
    job.refresh_from_db()
    assert job.status == "pending"
    question.refresh_from_db()
    assert question.answered_at == question.decisions.get().created_at
    # Numbered in order, with no gap: the question's answer, then the job's move.
    events = list(job.events.order_by("seq").values_list("seq", "type", "status", "message"))
    assert [seq for seq, *_ in events] == list(range(1, len(events) + 1)) and events[-1][0] == job.event_seq
    assert [event[1:3] for event in events[-2:]] == [("question", "answered"), ("status", "pending")]
    assert events[-2][3] == {"by": "desk", "channel": "api", "answer": {"approved": True}}


def test_an_answers_ledger_row_is_built_once_and_checked_where_the_check_is_on(monkeypatch, settings):
    """The ledger's INSERT is kept (dbkit.inserts, for every thread of the process): the second answer's is not
    built by the compiler; with the check on (the test settings) a kept text that is not the
    compiler's is caught."""
    from unittest import mock

    from django.db.models.sql.compiler import SQLInsertCompiler

    from approvals.models import Decision
    from dbkit.inserts import KEPT
    from dbkit.per_connection import forget

    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    api = client_for(make_user("desk", reviewer=True))
    first, second, third = (paused_on({})[1] for _ in range(3))
    api.post(f"/api/questions/{first.pk}/answer/", {"answer": {"approved": True}}, format="json")
    settings.KEPT_READS_CHECK = settings.JOBS_CHECK_MOVE_STATEMENTS = False
    with mock.patch.object(SQLInsertCompiler, "as_sql", side_effect=AssertionError("built again")):
        response = api.post(f"/api/questions/{second.pk}/answer/", {"answer": {"approved": False}, "comment": "no"},
                            format="json")
    assert response.status_code == 200, response.content
    second.refresh_from_db()
    decision = Decision.objects.get(question=second)
    assert (decision.kind, decision.answer, decision.comment, decision.actor_name, decision.channel) == (
        "rejected", {"approved": False}, "no", "desk", "api")
    assert (second.status, second.answer, second.comment, second.answered_by.username) == (
        "answered", {"approved": False}, "no", "desk")
    assert second.answered_at == decision.created_at

    settings.KEPT_READS_CHECK = True
    wrapper = connections["default"]
    kept = wrapper.__dict__[KEPT]
    try:
        for key in [key for key in kept if key[0] is Decision]:
            kept[key] = kept[key].replace('"kind"', '"kind" ', 1)
        with pytest.raises(AssertionError, match="differs from the compiler's"):
            api.post(f"/api/questions/{third.pk}/answer/", {"answer": {"approved": True}}, format="json")
    finally:
        forget(wrapper, KEPT)  # the texts are the process's, every thread's: none is left changed


def test_a_submit_through_the_api_is_one_statement_after_the_token(monkeypatch):
    """The job's INSERT and its first event's are one statement (jobs.events.job_create_with_first_event),
    in autocommit: no BEGIN and no COMMIT around them."""
    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    api = client_for(make_user("submitter"))
    api.post("/api/jobs/", {"kind": "demo.noop", "input": {}}, format="json")  # the token's last_used_at
    with CaptureQueriesContext(connection) as submit:
        response = api.post("/api/jobs/", {"kind": "demo.noop", "input": {}}, format="json")
    assert response.status_code == 201, response.content
    statements = [query["sql"] for query in submit.captured_queries]
    assert len(statements) == 2, "\n".join(sql[:160] for sql in statements)
    assert statements[1].startswith('WITH j AS (INSERT INTO "jobs_job"'), statements[1][:200]
    job = Job.objects.get(pk=response.json()["id"])
    assert [(event.seq, event.status) for event in job.events.all()] == [(1, "pending")]
    assert response.json()["updated_at"] == iso_utc(job.updated_at)  # the database's default, returned


def test_the_question_list_reads_the_same_number_of_statements_for_any_number_of_questions():
    """Each row's assignees and its round's approvals come with the page, not one query per row."""
    api = client_for(make_user("desk", reviewer=True))
    job, question = paused_on({})
    api.get("/api/questions/")  # the token's last_used_at

    def statements_for_the_list() -> tuple[int, list]:
        with CaptureQueriesContext(connection) as listing:
            response = api.get("/api/questions/")
        assert response.status_code == 200, response.content
        return len(listing), response.json()["results"]

    few, rows = statements_for_the_list()
    assert [row["approvals"] for row in rows] == [0]
    approve_once = client_for(make_user("voter", reviewer=True))
    question.required_approvals = 2
    question.save(update_fields=["required_approvals"])
    assert approve_once.post(f"/api/questions/{question.pk}/answer/", {"answer": {"approved": True}},
                             format="json").status_code == 200
    for _ in range(6):
        paused_on({})
    many, rows = statements_for_the_list()
    assert len(rows) == 7
    assert few == many, f"{few} statements for one question, {many} for seven"
    assert {row["id"]: row["approvals"] for row in rows}[str(question.pk)] == 1


def test_an_answer_reads_its_question_under_the_lock_with_a_statement_built_once(monkeypatch, settings):
    """The locked read of the question (with whether it is assigned to the answerer) is built by
    the ORM once per connection (dbkit.kept), not for every answer: that was a quarter of the
    answer's CPU. Each answer still gets its own question and its own answerer (tests/test_kept_reads.py
    shows the assignment read for each user)."""
    from django.db.models.sql.compiler import SQLCompiler

    from approvals.models import Question
    from tests.approvals.conftest import answer_group, member_of

    monkeypatch.setattr("jobs.services.transitions.job_dispatch", lambda **kwargs: None)
    settings.KEPT_READS_CHECK = False  # that check builds every read through the ORM as well
    desk = answer_group("desk")
    ann, bob = member_of(desk, "ann"), member_of(desk, "bob")
    questions = [paused_on({})[1] for _ in range(3)]
    for question in questions:
        question.assigned_groups.add(desk)
    client_for(ann).post(f"/api/questions/{questions[0].pk}/answer/", {"answer": {"approved": True}}, format="json")
    locked_reads = []
    as_sql = SQLCompiler.as_sql

    def counting(compiler, *args, **kwargs):
        if compiler.query.model is Question and compiler.query.select_for_update:
            locked_reads.append(compiler.query)
        return as_sql(compiler, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counting)
    for question, user in [(questions[1], bob), (questions[2], ann)]:
        response = client_for(user).post(f"/api/questions/{question.pk}/answer/", {"answer": {"approved": True}},
                                         format="json")
        assert response.status_code == 200, response.content
        assert response.json()["id"] == str(question.pk) and response.json()["answered_by"] == user.username
    assert locked_reads == []
