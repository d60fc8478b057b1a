"""The admin, through Django's test client posting the real forms: a form per question type, the
inbox (default filter, filters, deadline order, age and time left), bulk approve / reject, the
ledger on the question and job pages, CSV export, and the index's count."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.models import Decision, Question
from approvals.schemas import approval, choice, form, multiple_choice, text
from approvals.services import question_answer
from jobs.models import Job
from tests.approvals.conftest import answer_group, member_of, paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:approvals_question_changelist"


def page_of(client, question) -> str:
    return client.get(reverse("admin:approvals_question_change", args=[question.pk])).content.decode()


def post_answer(client, question, data):
    return client.post(reverse("admin:approvals_question_answer", args=[question.pk]), data, follow=True)


def answer_of(question) -> object:
    return Question.objects.get(pk=question.pk).answer


# -- a real form per type ------------------------------------------------------------------------
def test_approval_form_requires_a_reason_to_reject(client, reviewer):
    _, question = paused_on({"schema": approval()})
    client.force_login(reviewer)
    page = page_of(client, question)
    assert 'name="_approve"' in page and 'name="_reject"' in page and "Reason (required to reject)" in page
    refused = post_answer(client, question, {"_reject": "Reject", "reason": ""}).content.decode()
    assert "give a reason to reject" in refused and answer_of(question) is None
    post_answer(client, question, {"_reject": "Reject", "reason": "wrong totals"})
    assert answer_of(question) == {"approved": False, "reason": "wrong totals"}


def test_choice_is_radio_buttons(client, reviewer):
    _, question = paused_on({"schema": choice({"eu": "Europe", "us": "America"})})
    client.force_login(reviewer)
    page = page_of(client, question)
    assert page.count('type="radio"') == 2 and "Europe" in page
    post_answer(client, question, {"choice": json.dumps("us"), "comment": "closer"})
    assert answer_of(question) == "us"
    assert Decision.objects.get(question=question).comment == "closer"


def test_multiple_choice_is_checkboxes_and_the_schema_limits_how_many(client, reviewer):
    _, question = paused_on({"schema": multiple_choice(["a", "b", "c"], min_items=1, max_items=2)})
    client.force_login(reviewer)
    assert page_of(client, question).count('type="checkbox"') == 3
    too_many = post_answer(client, question, {"choices": [json.dumps(v) for v in "abc"]}).content.decode()
    assert "not recorded" in too_many and answer_of(question) is None
    post_answer(client, question, {"choices": [json.dumps("a"), json.dumps("c")]})
    assert answer_of(question) == ["a", "c"]


def test_free_text_is_a_text_area_with_its_maximum(client, reviewer):
    _, question = paused_on({"schema": text(max_length=12)})
    client.force_login(reviewer)
    page = page_of(client, question)
    assert re.search(r'<textarea name="text"[^>]*maxlength="12"', page)
    post_answer(client, question, {"text": "thirteen char"})
    assert answer_of(question) is None
    post_answer(client, question, {"text": "fine by me"})
    assert answer_of(question) == "fine by me"


def test_a_flat_object_schema_is_a_generated_form(client, reviewer):
    schema = form({
        "type": "object",
        "properties": {
            "amount": {"type": "number", "minimum": 0, "title": "Amount"},
            "nights": {"type": "integer", "maximum": 30},
            "receipt": {"type": "boolean"},
            "budget": {"type": "string", "enum": ["travel", "training"]},
            "note": {"type": "string", "maxLength": 50},
        },
        "required": ["amount"],
        "additionalProperties": False,
    })
    _, question = paused_on({"schema": schema})
    client.force_login(reviewer)
    page = page_of(client, question)
    assert 'type="number"' in page and 'type="checkbox"' in page and "<select" in page
    assert "answer_json" not in page
    labels = re.findall(r'<label for="id_p_(\w+)"', page)
    assert labels == ["amount", "nights", "receipt", "budget", "note"]  # in the author's order
    post_answer(client, question, {"p_amount": "12.5", "p_nights": "2", "p_receipt": "on", "p_budget": '"travel"',
                                   "p_note": ""})
    assert answer_of(question) == {"amount": 12.5, "nights": 2, "receipt": True, "budget": "travel"}


def test_a_nested_schema_falls_back_to_json(client, reviewer):
    schema = {"type": "object", "properties": {"lines": {"type": "array", "items": {"type": "object"}}},
              "required": ["lines"]}
    _, question = paused_on({"schema": schema})
    client.force_login(reviewer)
    assert 'name="answer_json"' in page_of(client, question)
    post_answer(client, question, {"answer_json": '{"lines": [{"sku": 1}]}'})
    assert answer_of(question) == {"lines": [{"sku": 1}]}


def test_details_are_rendered_readably_above_the_form(client, reviewer):
    details = {"customer": "ACME", "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]}
    _, question = paused_on({"details": details})
    client.force_login(reviewer)
    page = page_of(client, question)
    assert '<dl class="question-details">' in page and "<dt>customer</dt><dd>ACME</dd>" in page
    assert "<th>sku</th>" in page and "<th>qty</th>" in page and "<td>B-7</td>" in page
    assert page.index("question-details") < page.index('id="answer-form"')


def test_someone_who_may_not_answer_sees_why_instead_of_a_form(client):
    answer_group("legal")
    _, question = paused_on({"assignees": "group:legal"})
    outsider = make_user("outsider", reviewer=True)
    client.force_login(outsider)
    page = page_of(client, question)
    assert 'id="answer-form"' not in page and "assigned to group:legal" in page


# -- the inbox ---------------------------------------------------------------------------------
def test_the_inbox_opens_on_the_questions_waiting_for_me_soonest_deadline_first(client, reviewer):
    answer_group("legal")
    _, mine_late = paused_on({"key": "late", "timeout": 7200})
    _, mine_soon = paused_on({"key": "soon", "timeout": 600})
    _, mine_none = paused_on({"key": "none"})
    _, not_mine = paused_on({"key": "legal", "assignees": "group:legal"})
    client.force_login(reviewer)
    response = client.get(reverse(CHANGELIST))
    rows = list(response.context["cl"].result_list)
    assert rows == [mine_soon, mine_late, mine_none]
    page = response.content.decode()
    assert "Waiting for me (assigned to me and open)" in page
    assert re.search(r">in (9|10) min<", page)  # time left of the soonest, short
    everything = client.get(reverse(CHANGELIST), {"inbox": "all"}).context["cl"].result_list
    assert not_mine in list(everything)


def test_inbox_filters_by_status_kind_assignee_and_deadline(client, reviewer):
    legal = answer_group("legal")
    member_of(legal, "lee")
    _, overdue = paused_on({"key": "a", "timeout": 60})
    Question.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(minutes=5))
    _, legal_q = paused_on({"key": "b", "assignees": "group:legal"})
    _, answered = paused_on({"key": "c"})
    question_answer(question_id=answered.pk, user=reviewer, answer={"approved": True})
    client.force_login(make_user("root", superuser=True))

    def listed(**params):
        return set(client.get(reverse(CHANGELIST), {"inbox": "all", **params}).context["cl"].result_list)

    assert listed(status="answered") == {answered}
    assert listed(job__kind="test.ask") == {overdue, legal_q, answered}
    assert listed(assignee=f"group:{legal.pk}") == {legal_q}
    assert listed(deadline="overdue") == {overdue}
    assert listed(deadline="none") == {legal_q, answered}
    assert "overdue 5 min" in client.get(reverse(CHANGELIST), {"inbox": "all"}).content.decode()


def test_bulk_approve_checks_each_question_and_reports_done_and_refused(client, reviewer):
    answer_group("legal")
    job_a, a = paused_on({"key": "a"})
    job_b, b = paused_on({"key": "b", "assignees": "group:legal"})  # not the reviewer's
    _, c = paused_on({"key": "c", "schema": choice(["x", "y"])})  # not approve/reject
    _, quorum = paused_on({"key": "d", "schema": approval(), "required_approvals": 2})
    client.force_login(reviewer)
    response = client.post(
        reverse(CHANGELIST) + "?inbox=all",
        {"action": "approve_selected", "_selected_action": [a.pk, b.pk, c.pk, quorum.pk], "reason": "batch ok"},
        follow=True,
    )
    page = response.content.decode()
    assert "Approved 1 question(s)" in page
    assert "Recorded your approval on 1 question(s) that wait for more reviewers" in page
    assert "Refused 2" in page and "not one of them" in page and "not an approve/reject question" in page
    assert Question.objects.get(pk=a.pk).answer == {"approved": True, "reason": "batch ok"}
    assert Job.objects.get(pk=job_a.pk).status == "pending" and Job.objects.get(pk=job_b.pk).status == "paused"
    assert Question.objects.get(pk=quorum.pk).status == "open"


def test_bulk_reject_needs_the_reason_that_the_approval_type_requires(client, reviewer):
    _, strict = paused_on({"key": "a", "schema": approval()})
    client.force_login(reviewer)
    data = {"action": "reject_selected", "_selected_action": [strict.pk]}
    page = client.post(reverse(CHANGELIST), {**data, "reason": ""}, follow=True).content.decode()
    assert "Refused 1" in page and Question.objects.get(pk=strict.pk).status == "open"
    client.post(reverse(CHANGELIST), {**data, "reason": "duplicate"}, follow=True)
    assert Question.objects.get(pk=strict.pk).answer == {"approved": False, "reason": "duplicate"}


def test_the_admin_index_counts_the_questions_waiting_for_me(client, reviewer):
    paused_on({"key": "a"})
    paused_on({"key": "b"})
    client.force_login(reviewer)
    page = client.get(reverse("admin:index")).content.decode()
    assert re.search(r"<strong>2</strong>\s*questions waiting for you", page)
    client.force_login(make_user("viewer", staff=True))
    assert "waiting for you" not in client.get(reverse("admin:index")).content.decode()


# -- the ledger in the admin ---------------------------------------------------------------------
def test_the_ledger_shows_on_the_question_and_job_pages_and_exports_as_csv(client, reviewer):
    job, question = paused_on({"schema": approval(), "required_approvals": 2})
    second = make_user("second", reviewer=True)
    client.force_login(reviewer)
    post_answer(client, question, {"_approve": "Approve", "reason": "fine"})
    question_answer(question_id=question.pk, user=second, answer={"approved": False, "reason": "no"}, channel="api")
    page = page_of(client, question)
    ledger = page[page.index('id="ledger"'):]
    assert "approved (a vote) (1 of 2)" in ledger and "rejected" in ledger and "127.0.0.1" in ledger
    job_page = client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    assert "Decisions on its questions" in job_page and "second" in job_page
    superuser = make_user("root", superuser=True)
    client.force_login(superuser)
    response = client.post(reverse("admin:approvals_decision_changelist"),
                           {"action": "export_csv", "_selected_action": list(
                               Decision.objects.values_list("pk", flat=True))})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(row["kind"], row["actor"], row["channel"]) for row in rows] == [
        ("approved", "reviewer", "admin"), ("rejected", "second", "api")]
    assert rows[0]["digest"] == question.digest and rows[0]["client_address"] == "127.0.0.1"
    from_questions = client.post(reverse(CHANGELIST) + "?inbox=all",
                                 {"action": "export_decisions_csv", "_selected_action": [question.pk]})
    assert from_questions.content.decode().count("\n") == 3


def test_the_ledger_is_read_only_in_the_admin(client, reviewer):
    _, question = paused_on({})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True})
    decision = Decision.objects.get()
    client.force_login(make_user("root", superuser=True))
    assert client.get(reverse("admin:approvals_decision_delete", args=[decision.pk])).status_code == 403
    page = client.get(reverse("admin:approvals_decision_change", args=[decision.pk])).content.decode()
    assert 'name="_save"' not in page
    assert client.get(reverse("admin:approvals_decision_add")).status_code == 403
