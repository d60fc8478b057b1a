"""Child jobs: `ctx.spawn` / `ctx.map` spawn once, `ctx.gather` parks the parent (no worker held)
and the children's ends wake it exactly once; cancelling a parent cancels its unfinished
children, retrying it retries them; the API, the job page and the inbox show the family.

In-process (the runner called directly, `jobs.testing` for whole runs); the concurrent tests use
threads with their own database connections, so that the races are real, and stop the session's
worker first (`only_own_workers`): their jobs' messages are really sent, and a worker that took
one would claim a job the test claims itself."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.urls import reverse

from approvals.models import Question
from approvals.services import question_answer
from jobs.models import Job
from jobs.runner import job_execute
from jobs.services import job_cancel, job_claim, job_complete, job_retry, job_submit
from jobs.testing import run_kind
from tests.api.conftest import client_for
from tests.conftest import make_user

S = Job.Status


def statuses(job: Job) -> list[str]:
    return list(job.events.filter(type="status").order_by("seq").values_list("status", flat=True))


def children_of(job: Job) -> list[Job]:
    return list(Job.objects.filter(parent=job).order_by("created_at", "pk"))


@pytest.mark.django_db
def test_a_parent_spawns_once_parks_without_a_worker_and_resumes_once():
    run = run_kind("test.fanout", {"noop": 3, "ask": 2}, answers={"q": {"approved": True}})
    assert run.status == S.COMPLETED and run.result == {"results": 5}
    assert [child.spawn_key for child in run.children] == ["noop.0", "noop.1", "noop.2", "ask.0", "ask.1"]
    assert all(child.parent_id == run.job.pk and child.status == S.COMPLETED for child in run.children)
    # Parked once (waiting: no worker held), woken once by the last child, then done; the replay
    # of the map found its children instead of spawning them again.
    assert statuses(run.job) == ["pending", "processing", "waiting", "pending", "processing", "completed"]
    assert Job.objects.filter(parent=run.job).count() == 5
    spawns = [(e["step"], e["status"]) for e in run.events if e["type"] == "step"]
    assert spawns == [("noop", "completed"), ("ask", "completed"), ("fail", "skipped"),
                      ("noop", "skipped"), ("ask", "skipped"), ("fail", "skipped")]
    woken = run.job.events.filter(type="status", status="pending").order_by("seq").last()
    assert woken.message["by"] == "children"


@pytest.mark.django_db
def test_fail_fast_fails_the_parent_with_the_first_failure_and_cancels_the_rest():
    run = run_kind("test.fanout", {"ask": 1, "fail": 1})  # the question is never answered
    assert run.status == S.FAILED and run.error["code"] == "child_failed"
    assert "child 'fail.0' (test.refuse" in run.error["message"] and "bad_data" in run.error["message"]
    asking = run.child("ask.0")
    assert asking.status == S.CANCELLED
    assert Question.objects.get(job=asking).status == Question.Status.CANCELLED


@pytest.mark.django_db
def test_collect_waits_for_every_child_and_returns_each_outcome():
    run = run_kind("test.fanout", {"noop": 2, "fail": 1, "policy": "collect"})
    assert run.status == S.COMPLETED
    assert run.result == {"statuses": ["completed", "completed", "failed"], "ok": 2}


@pytest.mark.django_db
def test_a_replay_that_spawns_a_key_with_another_input_fails_the_parent():
    parent, _ = job_submit(kind="test.spawn_changing", input={"steps": 1})
    job_execute(job_id=parent.pk)  # spawns, then asks
    Job.objects.filter(pk=parent.pk).update(input={"steps": 2})  # as if the code outside steps changed
    question_answer(question_id=Question.objects.get(job=parent).pk, user=make_user("boss", superuser=True),
                    answer={"approved": True})
    job_execute(job_id=parent.pk)
    parent.refresh_from_db()
    assert parent.status == S.FAILED and parent.error["code"] == "child_changed"
    assert Job.objects.filter(parent=parent).count() == 1


@pytest.mark.django_db
def test_cancelling_a_parent_cancels_its_unfinished_children_and_their_questions():
    parent, _ = job_submit(kind="test.fanout", input={"noop": 1, "ask": 2})
    job_execute(job_id=parent.pk)
    noop, asking, waiting = children_of(parent)
    job_execute(job_id=noop.pk)
    job_execute(job_id=asking.pk)  # paused on its question
    assert Job.objects.get(pk=parent.pk).status == S.WAITING
    job_cancel(job_id=parent.pk, actor=make_user("boss", superuser=True), channel="admin")
    assert [c.status for c in children_of(parent)] == [S.COMPLETED, S.CANCELLED, S.CANCELLED]
    assert Question.objects.get(job=asking).status == Question.Status.CANCELLED
    assert Job.objects.get(pk=parent.pk).status == S.CANCELLED
    cancelled = waiting.events.filter(type="status", status="cancelled").get()
    assert cancelled.message["cascade"] == "parent cancelled"

    # Retrying the parent retries the children it cancelled; the finished one stays finished.
    job_retry(job_id=parent.pk)
    assert [c.status for c in children_of(parent)] == [S.COMPLETED, S.PENDING, S.PENDING]
    assert Job.objects.get(pk=parent.pk).status == S.PENDING


@pytest.mark.django_db
def test_the_api_shows_parent_and_children_oldest_first():
    owner = make_user("shop")
    parent, _ = job_submit(kind="test.fanout", input={"noop": 3}, owner=owner)
    job_execute(job_id=parent.pk)
    children = children_of(parent)
    api = client_for(owner)
    body = api.get(f"/api/jobs/{parent.pk}/").json()
    assert body["parent"] is None and body["children"] == [str(child.pk) for child in children]
    child = api.get(f"/api/jobs/{children[0].pk}/").json()  # the owner's, like the parent
    assert child["parent"] == str(parent.pk) and child["children"] == []
    listed = {job["id"]: job for job in api.get("/api/jobs/").json()["results"]}
    assert listed[str(parent.pk)]["children"] == body["children"]


@pytest.mark.django_db
def test_a_childs_question_shows_its_parent_on_the_job_page_and_in_the_inbox(client):
    parent, _ = job_submit(kind="test.fanout", input={"ask": 1})
    job_execute(job_id=parent.pk)
    [child] = children_of(parent)
    job_execute(job_id=child.pk)
    client.force_login(make_user("boss", superuser=True))
    page = client.get(reverse("jobs:job-detail", args=[child.pk])).content.decode()
    assert "part of" in page and reverse("jobs:job-detail", args=[parent.pk]) in page and "ask.0" in page
    parent_page = client.get(reverse("jobs:job-detail", args=[parent.pk])).content.decode()
    assert "1 paused" in parent_page and reverse("jobs:job-detail", args=[child.pk]) in parent_page
    inbox = client.get(reverse("admin:approvals_question_changelist"), {"inbox": "all"}).content.decode()
    assert 'class="parent-job"' in inbox and reverse("admin:jobs_job_change", args=[parent.pk]) in inbox
    admin_page = client.get(reverse("admin:jobs_job_change", args=[parent.pk])).content.decode()
    assert "1 children" in admin_page and f"?parent__id__exact={parent.pk}" in admin_page
    filtered = client.get(reverse("admin:jobs_job_changelist"), {"parent__id__exact": str(parent.pk)})
    assert filtered.status_code == 200 and str(child.pk)[:8] in filtered.content.decode()


# -- races, for real: threads with their own connections ------------------------------------------------
def _together(*actions) -> list[BaseException | None]:
    """Run the actions at the same moment, each in a thread with its own database connection."""
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException | None] = [None] * len(actions)

    def run(index: int, action) -> None:
        try:
            barrier.wait()
            action()
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            errors[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


def _parked_parent_with_running_children(count: int) -> tuple[Job, list[Job]]:
    parent, _ = job_submit(kind="test.fanout", input={"noop": count})
    job_execute(job_id=parent.pk)
    children = [job_claim(job_id=child.pk) for child in children_of(parent)]
    return parent, children


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(4))
def test_children_ending_at_once_wake_the_parent_exactly_once(round_, only_own_workers):
    parent, children = _parked_parent_with_running_children(3)
    errors = _together(*[lambda child=child: job_complete(job=child, result={}) for child in children])
    assert errors == [None, None, None]
    assert statuses(parent).count("waiting") == 1
    assert statuses(parent)[-1] == "pending" and statuses(parent).count("pending") == 2  # submitted, woken once


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(4))
def test_a_child_ending_while_its_parent_parks_wakes_it_exactly_once(round_, only_own_workers):
    """The last child ends while the parent's run is between its check and its park: either the
    park sees it (and resumes at once) or the child's end sees the park; never both, never none."""
    parent, _ = job_submit(kind="test.fanout", input={"noop": 1})
    job_execute(job_id=parent.pk)  # spawned and parked
    [child] = children_of(parent)
    # Put the parent back to running, as a resumed run that reaches gather again.
    from jobs.services import job_transition, job_wake

    job_wake(job_id=parent.pk, on="")  # ctx.gather parks on nothing named: its children wake it
    job_transition(job_id=parent.pk, to=S.PROCESSING, from_=[S.PENDING])
    running_child = job_claim(job_id=child.pk)
    from jobs.services import job_suspend
    from jobs.services.family import gather_park_apply

    claimed = Job.objects.get(pk=parent.pk)
    errors = _together(
        lambda: job_suspend(job=claimed, to=S.WAITING,
                            apply=lambda job: gather_park_apply(job=job, ids=[str(child.pk)], policy="fail_fast")),
        lambda: job_complete(job=running_child, result={}),
    )
    assert errors == [None, None]
    after_park = statuses(parent)[statuses(parent).index("waiting", 3):]
    assert after_park == ["waiting", "pending"], statuses(parent)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_cancelling_a_parent_while_its_children_end_never_deadlocks(round_, only_own_workers):
    parent, children = _parked_parent_with_running_children(4)
    errors = _together(
        lambda: job_cancel(job_id=parent.pk),
        *[lambda child=child: job_complete(job=child, result={}) for child in children],
    )
    # A child that ended first stays completed; the cancel finds the rest (their runs then lose
    # their writes): no deadlock, no lost update, and the parent ends cancelled either way.
    assert all(error is None or "InvalidTransition" in type(error).__name__ for error in errors), errors
    assert Job.objects.get(pk=parent.pk).status == S.CANCELLED
    assert all(child.status in (S.COMPLETED, S.CANCELLED) for child in children_of(parent))


@pytest.mark.django_db
def test_children_of_several_kinds_spawned_at_once_are_each_their_own():
    """A spawn of several children is one statement (`jobs.events.jobs_create_with_first_events`):
    each child's kind, input, attempt budget and key are its own, its parent and owner the parent's."""
    from jobs.models import JobEvent
    from jobs.services.family import children_spawn
    from jobs.services.submitting import attempt_budget

    owner = make_user("family-owner")
    submitted, _ = job_submit(kind="demo.noop", input={}, owner=owner)
    parent = job_claim(job_id=submitted.pk, worker="w")
    specs = [("a", "demo.noop", {}), ("b", "test.crash", {"n": 1}), ("c", "demo.noop", {"text": "it's"})]
    children = children_spawn(parent=parent, run_attempt=parent.attempts, step="family", specs=specs)
    assert [(child.spawn_key, child.kind, child.input) for child in children] == specs
    for child, (_, kind, _) in zip(children, specs, strict=True):
        stored = Job.objects.get(pk=child.pk)
        assert (stored.kind, stored.input, stored.spawn_key) == (child.kind, child.input, child.spawn_key)
        assert (stored.parent_id, stored.owner_id, stored.status) == (parent.pk, owner.pk, S.PENDING)
        assert stored.max_attempts == child.max_attempts == attempt_budget(kind)
        assert list(JobEvent.objects.filter(job=stored).values_list("seq", "status")) == [(1, S.PENDING)]
    assert attempt_budget("test.crash") != attempt_budget("demo.noop")  # the budgets tell the rows apart
    assert children_spawn(parent=parent, run_attempt=parent.attempts, step="family", specs=specs) == children
