"""Shared fixtures: the embedded Redis when REDIS_URL is unset, a real Celery worker, users."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from tests.support.processes import celery_worker, session_processes

REVIEWER_PERMISSIONS = [
    "jobs.view_job", "jobs.view_jobevent", "approvals.view_question", "approvals.answer_question",
    "approvals.view_decision", "waits.view_wait", "waits.view_waitdecision",
]


_started_embedded_redis = False


def pytest_configure(config):
    # `make test` without REDIS_URL uses the embedded server, as `make run` does, and stops it at
    # the end if it started it (as `make run` does): no server is left behind a test run.
    global _started_embedded_redis
    if not os.environ.get("REDIS_URL"):
        from devtools import embedded_redis

        _started_embedded_redis = not embedded_redis.is_answering()
        embedded_redis.start()


def pytest_unconfigure(config):
    if _started_embedded_redis:
        from devtools import embedded_redis

        embedded_redis.stop()


@pytest.fixture(scope="session")
def live_worker(django_db_setup, django_db_blocker):
    """One real Celery worker process for the session, on the test database and Redis."""
    worker = celery_worker(name="session-worker").start()
    session_processes.append(worker)
    yield worker
    worker.stop()


@pytest.fixture
def only_own_workers(transactional_db):
    """Stop the session's worker and beat (those that run) and empty the session's queues, so
    that only the workers a test starts take its jobs (the chaos tests kill and stop theirs), and
    nothing an earlier test left runs in them first: beat's passes, a message a stopped worker
    gave back. `worker` (and tests/waits' `stack`) start them again when a test needs them."""
    for running in session_processes:
        if running.proc and running.proc.poll() is None:
            running.stop()
    queues_emptied()


def queues_emptied() -> None:
    """Every message in the session's queues dropped (their jobs are an earlier test's: its rows
    are gone with its transactional database)."""
    from ops.metrics import queue_names
    from taskplatform.celery import app

    with app.connection_for_write() as conn:
        for name in queue_names():
            conn.default_channel.queue_purge(name)


@pytest.fixture
def worker(live_worker, transactional_db):
    """A running worker for a test whose rows it must see (so: transactional)."""
    if live_worker.proc.poll() is not None:
        live_worker.start()
    return live_worker


def reviewers_group() -> Group:
    """The `reviewers` group as its migration makes it (a transactional test's flush drops it)."""
    group, _ = Group.objects.get_or_create(name="reviewers")
    for dotted in REVIEWER_PERMISSIONS:
        app_label, codename = dotted.split(".")
        group.permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return group


def make_user(username: str, *, reviewer: bool = False, staff: bool = False, superuser: bool = False):
    user = get_user_model().objects.create_user(
        username=username, password=username, is_staff=staff or reviewer or superuser, is_superuser=superuser
    )
    if reviewer:
        user.groups.add(reviewers_group())
    return user


@pytest.fixture
def reviewer(db):
    return make_user("reviewer", reviewer=True)


@pytest.fixture
def submitter(db):
    return make_user("submitter")


@pytest.fixture
def superuser(db):
    return make_user("boss", superuser=True)
