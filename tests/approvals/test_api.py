"""The same rules through the API: typed answers validated, assignees, quorum votes, the ledger."""

from __future__ import annotations

import pytest

from approvals.schemas import approval, multiple_choice
from tests.api.conftest import client_for
from tests.approvals.conftest import answer_group, member_of, paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def answer(client, question, body, **extra):
    return client.post(f"/api/questions/{question.pk}/answer/", body, format="json", **extra)


def test_a_question_shows_its_type_assignees_and_quorum(reviewer):
    _, question = paused_on({"schema": approval(), "required_approvals": 2, "assignees": ["reviewer"]})
    body = client_for(reviewer).get(f"/api/questions/{question.pk}/").json()
    assert body["type"] == "approval" and body["assignees"] == ["reviewer"]
    assert body["required_approvals"] == 2 and body["approvals"] == 0


def test_a_multiple_choice_answer_outside_its_bounds_is_400():
    reviewer = make_user("rev", reviewer=True)
    _, question = paused_on({"schema": multiple_choice(["a", "b", "c"], max_items=1)})
    response = answer(client_for(reviewer), question, {"answer": ["a", "b"]})
    assert response.status_code == 400 and response.json()["code"] == "invalid_answer"


def test_a_reviewer_who_is_not_assigned_gets_403_naming_the_assignees():
    legal = answer_group("legal")
    member_of(legal, "lee")
    outsider = make_user("outsider", reviewer=True)  # staff: sees it, may not answer it
    _, question = paused_on({"assignees": "group:legal"})
    response = answer(client_for(outsider), question, {"answer": {"approved": True}})
    assert response.status_code == 403 and "assigned to group:legal" in response.json()["detail"]


def test_quorum_votes_through_the_api_and_a_second_vote_is_409(reviewer):
    second = make_user("second", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 2})
    first = client_for(reviewer)
    voted = answer(first, question, {"answer": {"approved": True}}, REMOTE_ADDR="192.0.2.10")
    assert voted.status_code == 200 and voted.json()["status"] == "open" and voted.json()["approvals"] == 1
    again = answer(first, question, {"answer": {"approved": True}})
    assert again.status_code == 409 and again.json()["code"] == "already_voted"
    done = answer(client_for(second), question, {"answer": {"approved": True}, "comment": "agreed"})
    assert done.status_code == 200 and done.json()["status"] == "answered" and done.json()["answered_by"] == "second"
    ledger = first.get(f"/api/questions/{question.pk}/decisions/").json()
    assert [(row["kind"], row["actor"], row["channel"]) for row in ledger] == [
        ("approved", "reviewer", "api"), ("approved", "second", "api")]
    assert ledger[0]["client_address"] == "192.0.2.10" and ledger[1]["comment"] == "agreed"
    assert ledger[0]["digest"] == question.digest and ledger[0]["detail"] == {"approvals": 1, "required": 2}


def test_the_ledger_is_hidden_from_those_who_may_not_see_the_question(reviewer):
    _, question = paused_on({})
    stranger = client_for(make_user("stranger"))
    assert stranger.get(f"/api/questions/{question.pk}/decisions/").status_code == 404
