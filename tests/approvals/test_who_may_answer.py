"""Who may answer: assignees (users and groups, default `reviewers`), the answer permission, no
self-approval unless the kind allows it, and quorum (distinct approvals; a rejection decides)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from approvals.models import Decision, Question
from approvals.schemas import approval
from approvals.selectors import questions_answerable_by, questions_waiting_count, questions_waiting_for
from approvals.services import AlreadyAnswered, AlreadyVoted, NotAllowedToAnswer, question_answer
from jobs.models import Job, JobEvent
from jobs.runner import job_execute
from jobs.selectors import jobs_visible_to
from tests.approvals.conftest import answer_group, member_of, paused_on
from tests.conftest import make_user, reviewers_group

pytestmark = pytest.mark.django_db
YES = {"approved": True}


def test_by_default_the_group_reviewers_is_asked(reviewer):
    _, question = paused_on({})
    assert question.assignee_names() == ["group:reviewers"]
    assert list(questions_answerable_by(reviewer)) == [question]


def test_assigned_users_and_groups_may_answer_and_nobody_else(reviewer):
    finance = answer_group("finance")
    fiona = member_of(finance, "fiona")
    alice = member_of(reviewers_group(), "alice")  # a reviewer (not staff), but not assigned
    job, question = paused_on({"assignees": ["reviewer", "group:finance"]})
    assert question.assignee_names() == ["reviewer", "group:finance"]
    with pytest.raises(NotAllowedToAnswer, match="assigned to reviewer, group:finance; 'alice' is not one of them"):
        question_answer(question_id=question.pk, user=alice, answer=YES)
    assert question not in questions_answerable_by(alice)
    assert job not in jobs_visible_to(alice)
    assert question in questions_answerable_by(fiona) and job in jobs_visible_to(fiona)
    question_answer(question_id=question.pk, user=fiona, answer=YES)
    assert Question.objects.get(pk=question.pk).answered_by == fiona


def test_an_assignee_still_needs_the_answer_permission():
    bob = make_user("bob")
    _, question = paused_on({"assignees": "bob"})
    with pytest.raises(NotAllowedToAnswer, match="answer_question"):
        question_answer(question_id=question.pk, user=bob, answer=YES)
    assert not questions_answerable_by(bob).exists()


def test_a_superuser_may_answer_any_question(superuser):
    answer_group("ops")
    _, question = paused_on({"assignees": "group:ops"})
    question_answer(question_id=question.pk, user=superuser, answer=YES)


def test_the_submitter_may_not_answer_their_own_job(kind_options):
    rita = make_user("rita", reviewer=True)
    job, question = paused_on({}, owner=rita)
    with pytest.raises(NotAllowedToAnswer, match="submitted this job"):
        question_answer(question_id=question.pk, user=rita, answer=YES)
    assert question not in questions_answerable_by(rita)
    assert questions_waiting_count(rita) == 0
    assert job in jobs_visible_to(rita)  # still sees it: she made it
    kind_options("test.ask", allow_self_approval=True)
    assert questions_waiting_count(rita) == 1
    question_answer(question_id=question.pk, user=rita, answer=YES)


def test_quorum_needs_distinct_approvals_and_records_each_vote(reviewer):
    second, third = make_user("second", reviewer=True), make_user("third", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 2})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": True, "reason": "fine"})
    question.refresh_from_db()
    assert question.status == "open" and question.approvals_so_far() == 1
    assert Job.objects.get(pk=job.pk).status == "paused"
    assert JobEvent.objects.filter(job=job, type="question", status="voted").count() == 1
    # The same reviewer cannot count twice, and no longer sees it waiting.
    with pytest.raises(AlreadyVoted, match="needs 1 more approval"):
        question_answer(question_id=question.pk, user=reviewer, answer=YES)
    assert question not in questions_waiting_for(reviewer) and question in questions_waiting_for(second)
    question_answer(question_id=question.pk, user=second, answer=YES)
    question.refresh_from_db()
    assert question.status == "answered" and question.answered_by == second
    assert question.approvers() == ["reviewer", "second"]
    assert Job.objects.get(pk=job.pk).status == "pending"
    with pytest.raises(AlreadyAnswered, match="already answered by second"):
        question_answer(question_id=question.pk, user=third, answer=YES)
    votes = Decision.objects.filter(question=question).order_by("id")
    assert [(d.kind, d.actor_name, d.detail) for d in votes] == [
        ("approved", "reviewer", {"approvals": 1, "required": 2}),
        ("approved", "second", {"approvals": 2, "required": 2}),
    ]
    job_execute(job_id=job.pk)
    assert Job.objects.get(pk=job.pk).result["approvers"] == ["reviewer", "second"]


def test_any_rejection_decides_a_quorum_at_once(reviewer):
    second = make_user("second", reviewer=True)
    job, question = paused_on({"schema": approval(), "required_approvals": 3})
    question_answer(question_id=question.pk, user=reviewer, answer=YES)
    question_answer(question_id=question.pk, user=second, answer={"approved": False, "reason": "over budget"})
    question.refresh_from_db()
    assert question.status == "answered" and question.answer == {"approved": False, "reason": "over budget"}
    assert Job.objects.get(pk=job.pk).status == "pending"
    assert list(question.decisions.values_list("kind", flat=True)) == ["approved", "rejected"]


def test_the_reviewers_group_is_made_when_missing(db):
    Group.objects.filter(name="reviewers").delete()
    _, question = paused_on({})
    assert question.assignee_names() == ["group:reviewers"]
