"""Reading one question, job or wait as a reviewer costs the same at any size: PostgreSQL checks
that row's assignment, not every question ever assigned to the reviewer's groups.

Each read is run under `EXPLAIN ANALYZE` with 3,000 other questions assigned to the reviewers
group (20 to a job, beside 3,000 jobs that asked nothing; the tables' statistics taken, as
autovacuum would), and the rows its plan went through are counted: 10-14 here. Before
`accounts.assignment` they were 6,000-15,000: PostgreSQL read a question through a hashed set of
every question the reviewer may answer, and a job through one of every question assigned to their
groups (40 ms for one question at 11,000: bench/README.md, "A reviewer's reads at scale")."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import Question
from approvals.selectors import question_get_visible
from jobs.models import Job
from jobs.selectors import job_get_visible
from tests.approvals.conftest import member_of, paused_on
from tests.conftest import reviewers_group
from waits.models import Wait
from waits.selectors import wait_get_visible

pytestmark = pytest.mark.django_db
OTHERS = 3000
PER_JOB = 20
# The rows a read of one row goes through: the row, its job, the reviewer's user and group rows,
# the assignment's index entries. Far below OTHERS.
ROWS_AT_MOST = 40


def _rows_touched(plan: dict[str, Any]) -> int:
    """Rows every node of the plan produced, over all its loops."""
    own = plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1)
    return int(own) + sum(_rows_touched(child) for child in plan.get("Plans", []))


def _clones(job: Job, question: Question, count: int) -> None:
    """`count` more questions like `question`, assigned to the same groups, asked by jobs like
    `job`, `PER_JOB` to a job (a review with its reasons, a quorum's rounds)."""
    jobs = [Job(**{**_fields(job), "id": uuid.uuid4()}) for _ in range(count // PER_JOB)]
    Job.objects.bulk_create(jobs)
    # And as many jobs that asked nothing: most jobs do not.
    Job.objects.bulk_create([Job(**{**_fields(job), "id": uuid.uuid4(), "status": Job.Status.COMPLETED})
                             for _ in range(count)])
    questions = [Question(**{**_fields(question), "id": uuid.uuid4(), "job_id": each.pk, "key": f"q{index}"})
                 for each in jobs for index in range(PER_JOB)]
    Question.objects.bulk_create(questions)
    through = Question.assigned_groups.through
    groups = list(question.assigned_groups.values_list("pk", flat=True))
    through.objects.bulk_create([through(question_id=each.pk, group_id=group)
                                 for each in questions for group in groups])


def _fields(row) -> dict[str, Any]:
    return {field.attname: getattr(row, field.attname) for field in row._meta.concrete_fields}


@pytest.fixture
def reviewer(db):
    """A reviewer who is not staff (an API client's: `create_api_token --reviewer`), who sees the
    questions assigned to them and their jobs; staff see every row without any of these checks."""
    return member_of(reviewers_group(), "api-reviewer")


@pytest.fixture
def crowded(reviewer):
    if connection.vendor != "postgresql":
        pytest.skip("the plans are PostgreSQL's")
    job, question = paused_on({})  # assigned to the group `reviewers`, of which `reviewer` is a member
    _clones(job, question, OTHERS)
    wait = Wait.objects.create(job=job, key="render", token_salt=secrets.token_hex(8),
                               token_hash=secrets.token_hex(32))
    with connection.cursor() as cursor:
        for table in ("jobs_job", "approvals_question", "approvals_question_assigned_groups", "auth_user_groups"):
            cursor.execute(f"ANALYZE {table}")
    return job, question, wait


def _touched_by(read: Callable[[], Any], table: str) -> int:
    """The most rows the plan of one of `read`'s statements on `table` went through (a job is
    first looked for among the reader's own), the statements as sent."""
    with CaptureQueriesContext(connection) as sent:
        read()
    statements = [query["sql"] for query in sent.captured_queries if query["sql"].startswith(f'SELECT "{table}"."id"')]
    assert statements, sent.captured_queries
    touched = []
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}")
            plan = cursor.fetchone()[0]
            touched.append(_rows_touched((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]))
    return max(touched)


def test_one_question_is_read_through_its_own_assignment(crowded, reviewer):
    _, question, _ = crowded
    assert question_get_visible(user=reviewer, question_id=question.pk) == question
    assert _touched_by(lambda: question_get_visible(user=reviewer, question_id=question.pk),
                       "approvals_question") <= ROWS_AT_MOST


def test_one_job_is_read_through_its_own_questions(crowded, reviewer):
    job, _, _ = crowded
    assert job_get_visible(user=reviewer, job_id=job.pk) == job
    assert _touched_by(lambda: job_get_visible(user=reviewer, job_id=job.pk), "jobs_job") <= ROWS_AT_MOST


def test_one_wait_is_read_through_its_own_job(crowded, reviewer):
    _, _, wait = crowded
    assert wait_get_visible(user=reviewer, wait_id=wait.pk) == wait
    assert _touched_by(lambda: wait_get_visible(user=reviewer, wait_id=wait.pk), "waits_wait") <= ROWS_AT_MOST
