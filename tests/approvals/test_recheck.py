"""An answer is checked again when it is used: refused after `expires_at`; not used (the question
is asked again, as a new round) when a reviewer who approved is no longer allowed, when the
policy changed in code, or when it is older than `valid_for`. Jobs run in this process here;
`test_recheck_end_to_end.py` does the same with a real worker."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from approvals.models import Decision, Question
from approvals.schemas import approval
from approvals.services import QuestionExpired, question_answer, question_expire
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_retry, job_submit
from tests.api.conftest import client_for
from tests.approvals.conftest import answer_group, member_of, paused_on
from tests.conftest import make_user

pytestmark = pytest.mark.django_db
YES = {"approved": True}


def run(job: Job) -> Job:
    job_execute(job_id=job.pk)
    return Job.objects.get(pk=job.pk)


def reopened(question: Question) -> Decision:
    return Decision.objects.filter(question=question, kind="reopened").latest("id")


def resumes(job: Job) -> int:
    """How often the job was made runnable (the submit counts once)."""
    return job.events.filter(type="status", status="pending").count()


# -- at answer time: after expires_at ------------------------------------------------------------
def test_an_answer_after_expires_at_is_refused_before_beats_pass_and_the_ledger_says_so(reviewer):
    job, question = paused_on({"schema": approval(), "timeout": 600})
    Question.objects.filter(pk=question.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(QuestionExpired, match="deadline passed") as refused:
        question_answer(question_id=question.pk, user=reviewer, answer=YES, channel="api")
    assert refused.value.code == "question_expired" and refused.value.http_status == 409
    question.refresh_from_db()
    assert question.status == "open" and question.answer is None  # beat's pass has not come yet
    row = Decision.objects.get(question=question)
    assert (row.kind, row.actor_name, row.channel, row.answer) == ("refused", "reviewer", "api", YES)
    assert "after the deadline" in row.comment
    assert Job.objects.get(pk=job.pk).status == "paused" and resumes(job) == 1
    # Then the pass applies the policy (Fail), as it would have anyway.
    assert question_expire(question_id=question.pk) == "fail"
    assert Job.objects.get(pk=job.pk).error["code"] == "question_expired"


def test_the_api_answers_409_question_expired(desk_reviewer_api):
    _, question = paused_on({"timeout": 600})
    Question.objects.filter(pk=question.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = desk_reviewer_api.post(f"/api/questions/{question.pk}/answer/", {"answer": YES}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "question_expired"
    assert Decision.objects.get(question=question).kind == "refused"


def test_an_answer_before_expires_at_counts(reviewer):
    job, question = paused_on({"timeout": 600})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    assert Question.objects.get(pk=question.pk).status == "answered"


@pytest.fixture
def desk_reviewer_api(db):
    return client_for(make_user("desk", reviewer=True))


# -- at use: a reviewer no longer allowed --------------------------------------------------------
def test_a_reviewer_removed_from_the_group_between_two_votes_is_dropped_and_asked_again():
    finance = answer_group("finance")
    ann, bob, cleo = (member_of(finance, name) for name in ("ann", "bob", "cleo"))
    job, question = paused_on({"schema": approval(), "assignees": "group:finance", "required_approvals": 2})
    question_answer(question_id=question.pk, user=ann, answer=YES)
    ann.groups.remove(finance)
    question_answer(question_id=question.pk, user=bob, answer=YES)
    assert Question.objects.get(pk=question.pk).status == "answered"

    job = run(job)  # the job resumes; ctx.ask checks the answer before using it
    assert job.status == "paused", job.error
    question.refresh_from_db()
    assert (question.status, question.round, question.asked_again_because) == ("open", 2, "reviewer_no_longer_allowed")
    assert question.approvers() == ["bob"]  # bob's vote is still valid and carries over
    row = reopened(question)
    assert row.detail["because"] == "reviewer_no_longer_allowed" and row.detail["carried"] == ["bob"]
    assert row.detail["dropped"] == [{"reviewer": "ann", "why": row.detail["dropped"][0]["why"]}]
    assert row.comment.startswith("the approval of ann no longer counts")  # the group gave her the permission too
    carried = Decision.objects.get(question=question, round=2, kind="approved")
    assert (carried.actor, carried.channel, carried.detail["carried_over_from_round"]) == (bob, "system", 1)
    event = job.events.filter(type="question", status="open").latest("seq")
    assert event.message["round"] == 2 and event.message["asked_again_because"] == "reviewer_no_longer_allowed"
    assert "asked again (round 2), because" in question.asked_again_text()

    question_answer(question_id=question.pk, user=cleo, answer=YES)
    job = run(job)
    assert job.status == "completed" and job.result["approvers"] == ["bob", "cleo"] and job.result["round"] == 2


def test_a_deactivated_reviewers_approval_is_not_used():
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 2})
    question_answer(question_id=question.pk, user=ann, answer=YES)
    question_answer(question_id=question.pk, user=bob, answer=YES)
    bob.is_active = False
    bob.save(update_fields=["is_active"])
    job = run(job)
    question.refresh_from_db()
    assert job.status == "paused" and question.asked_again_because == "reviewer_no_longer_allowed"
    assert question.approvers() == ["ann"] and "bob was deactivated" in reopened(question).comment


def test_a_reviewer_who_lost_the_permission_no_longer_counts():
    ops = answer_group("ops")
    olga = member_of(ops, "olga")
    job, question = paused_on({"assignees": "olga"})
    question_answer(question_id=question.pk, user=olga, answer=YES)
    ops.permissions.remove(Permission.objects.get(codename="answer_question"))
    job = run(job)
    question.refresh_from_db()
    assert job.status == "paused" and question.round == 2 and question.approvers() == []
    assert "answer_question" in reopened(question).comment


def test_a_submitter_whose_kind_no_longer_allows_self_approval_no_longer_counts(kind_options):
    kind_options("test.ask", allow_self_approval=True)
    rita = make_user("rita", reviewer=True)
    job, question = paused_on({}, owner=rita)
    question_answer(question_id=question.pk, user=rita, answer=YES)
    kind_options("test.ask", allow_self_approval=False)
    job = run(job)
    assert job.status == "paused" and "submitted the job" in reopened(Question.objects.get(pk=question.pk)).comment


def test_votes_given_before_an_escalation_still_count():
    voter = make_user("voter", reviewer=True)
    boss = member_of(answer_group("managers"), "boss")
    job, question = paused_on({"schema": approval(), "required_approvals": 2, "timeout": 60, "assignees": ["voter"],
                               "on_timeout": {"action": "escalate", "to": "group:managers"}})
    question_answer(question_id=question.pk, user=voter, answer=YES)
    question_expire(question_id=question.pk, now=timezone.now() + timedelta(minutes=5))
    question_answer(question_id=question.pk, user=boss, answer=YES)
    job = run(job)
    assert job.status == "completed" and job.result["approvers"] == ["voter", "boss"]


# -- at use: the policy changed in code ----------------------------------------------------------
def test_raising_the_quorum_in_code_asks_again_and_keeps_the_votes():
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 1})
    question_answer(question_id=question.pk, user=ann, answer=YES)
    Job.objects.filter(pk=job.pk).update(input={"schema": approval(), "required_approvals": 2})  # new code
    job = run(job)
    question.refresh_from_db()
    assert job.status == "paused"
    assert (question.round, question.required_approvals, question.asked_again_because) == (2, 2, "policy_changed")
    assert question.approvers() == ["ann"]
    question_answer(question_id=question.pk, user=bob, answer=YES)
    job = run(job)
    assert job.status == "completed" and job.result["approvers"] == ["ann", "bob"]


@pytest.mark.parametrize("change", [
    {"assignees": ["group:reviewers", "someone"]},
    {"timeout": 3600},
    {"timeout": 600, "on_timeout": {"action": "cancel"}},
], ids=["assignees", "deadline", "deadline policy"])
def test_any_change_of_the_policy_asks_again(change, reviewer):
    make_user("someone", reviewer=True)
    job, question = paused_on({"timeout": 600})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    Job.objects.filter(pk=job.pk).update(input={"timeout": 600, **change})
    job = run(job)
    question.refresh_from_db()
    assert job.status == "paused" and question.asked_again_because == "policy_changed"
    assert question.approvers() == []  # one approval needed: the new round needs it afresh


def test_the_same_policy_written_the_same_way_uses_the_answer(reviewer):
    job, question = paused_on({"assignees": ["group:reviewers"], "timeout": 600})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    # Another spelling of the same rule: the default assignees, written out.
    Job.objects.filter(pk=job.pk).update(input={"timeout": 600.0})
    assert run(job).status == "completed"


def test_an_answer_given_before_policies_had_digests_is_still_used(reviewer):
    job, question = paused_on({})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    Question.objects.filter(pk=question.pk).update(policy_digest="")  # as the migration leaves old rows
    Job.objects.filter(pk=job.pk).update(input={"timeout": 60})
    assert run(job).status == "completed"


# -- at use: older than valid_for ----------------------------------------------------------------
def test_an_approval_older_than_valid_for_counts_as_none(reviewer):
    job, question = paused_on({"valid_for": 0.5})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    time.sleep(0.7)
    job = run(job)
    question.refresh_from_db()
    assert job.status == "paused" and question.asked_again_because == "approval_stale"
    assert question.valid_for == 0.5 and question.approvers() == []
    assert "valid_for" in reopened(question).comment
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    assert run(job).status == "completed"


def test_a_stale_vote_is_dropped_and_a_fresh_one_carries_over():
    ann, bob = make_user("ann", reviewer=True), make_user("bob", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 2, "valid_for": 1.0})
    question_answer(question_id=question.pk, user=ann, answer=YES)
    time.sleep(1.1)
    question_answer(question_id=question.pk, user=bob, answer=YES)
    job = run(job)
    question.refresh_from_db()
    assert job.status == "paused" and question.asked_again_because == "approval_stale"
    assert question.approvers() == ["bob"]


def test_a_stale_answer_of_another_type_is_asked_again_too(reviewer):
    job, question = paused_on({"schema": {"type": "string", "enum": ["a", "b"]}, "valid_for": 0.3})
    question_answer(question_id=question.pk, user=reviewer, answer="a")
    time.sleep(0.5)
    assert run(job).status == "paused"
    assert Question.objects.get(pk=question.pk).asked_again_because == "approval_stale"


# -- a job retried by hand -----------------------------------------------------------------------
def test_a_retried_job_asks_again_only_the_questions_whose_answers_fail_the_checks(reviewer):
    make_user("ann", reviewer=True)
    job, _ = job_submit(kind="test.ask_then_confirm", input={"valid_for": 1.0})
    run(job)
    first = Question.objects.get(job=job, key="q")
    question_answer(question_id=first.pk, user=reviewer, answer=YES)
    run(job)
    confirm = Question.objects.get(job=job, key="confirm")
    question_answer(question_id=confirm.pk, user=reviewer, answer=YES)
    Job.objects.filter(pk=job.pk).update(status="failed", error={"code": "x", "message": "planned"})
    time.sleep(1.1)  # `q`'s approval is now older than its valid_for; `confirm` has no limit
    job_retry(job_id=job.pk)
    job = run(job)
    assert job.status == "paused"
    first.refresh_from_db()
    confirm.refresh_from_db()
    assert (first.status, first.round, first.asked_again_because) == ("open", 2, "approval_stale")
    assert (confirm.status, confirm.round) == ("answered", 1)
    question_answer(question_id=first.pk, user=reviewer, answer=YES)
    job = run(job)
    assert job.status == "completed" and job.result["round"] == 2


def test_the_api_shows_the_round_and_why(desk_reviewer_api, reviewer):
    job, question = paused_on({"valid_for": 0.3})
    body = desk_reviewer_api.get(f"/api/questions/{question.pk}/").json()
    assert (body["round"], body["asked_again_because"], body["valid_for"]) == (1, None, 0.3)
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    time.sleep(0.5)
    run(job)
    body = desk_reviewer_api.get(f"/api/questions/{question.pk}/").json()
    assert (body["round"], body["asked_again_because"], body["status"]) == (2, "approval_stale", "open")


def test_the_openapi_schema_has_the_round_and_why(client):
    schema = client.get("/api/schema/", {"format": "json"}).json()
    question = schema["components"]["schemas"]["Question"]["properties"]
    assert question["round"]["type"] == "integer"
    assert question["asked_again_because"]["type"] == "string" and question["asked_again_because"].get("nullable")
    assert "reviewer_no_longer_allowed" in question["asked_again_because"]["description"]
    responses = schema["paths"]["/api/questions/{id}/answer/"]["post"]["responses"]
    assert "409" in responses


def test_demo_review_takes_the_quorum_the_deadline_and_valid_for(reviewer):
    job, _ = job_submit(kind="demo.review", input={"document": "Q3", "required_approvals": 2, "timeout": 600,
                                                   "valid_for": 86400})
    job = run(job)
    question = Question.objects.get(job=job)
    assert (question.required_approvals, question.valid_for, question.on_timeout) == (2, 86400, {"action": "fail"})
    assert question.expires_at is not None


def test_the_reviewers_are_told_again_with_the_reason(django_capture_on_commit_callbacks, monkeypatch, reviewer):
    from django.core import mail

    from approvals.services import question_notify

    reviewer.email = "reviewer@example.com"
    reviewer.save(update_fields=["email"])
    sent = []
    monkeypatch.setattr("approvals.tasks.question_notification_send.delay", lambda *args: sent.append(args))
    job, question = paused_on({"valid_for": 0.3})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    time.sleep(0.5)
    with django_capture_on_commit_callbacks(execute=True):
        run(job)
    assert sent[-1] == (str(question.pk), "reopened")
    assert question_notify(question_id=question.pk, action="reopened") == 1
    assert "asked again (round 2), because the approval of reviewer was" in mail.outbox[-1].body


def test_the_inbox_the_question_page_and_the_job_page_say_asked_again_because(reviewer, superuser):
    from django.test import Client
    from django.urls import reverse

    job, question = paused_on({"valid_for": 0.3})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    time.sleep(0.5)
    run(job)
    browser = Client()
    browser.force_login(superuser)
    inbox = browser.get(reverse("admin:approvals_question_changelist"), {"inbox": "all"}).content.decode()
    assert "asked again (round 2), because the answer was older than" in inbox
    page = browser.get(reverse("admin:approvals_question_change", args=[question.pk])).content.decode()
    assert "asked again (round 2), because the approval of reviewer was" in page
    job_page = browser.get(reverse("jobs:job-detail", args=[job.pk])).content.decode()
    assert 'class="asked-again"' in job_page and "Asked again (round 2), because the approval" in job_page


def test_the_job_page_says_the_deadline_passed_instead_of_offering_the_form(reviewer):
    from django.test import Client
    from django.urls import reverse

    job, question = paused_on({"timeout": 600})
    Question.objects.filter(pk=question.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    browser = Client()
    browser.force_login(reviewer)
    page = browser.get(reverse("jobs:job-detail", args=[job.pk])).content.decode()
    assert "its deadline passed at" in page and 'class="answer"' not in page
