"""Two identical requests with the same idempotency key at the same moment make one job."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from jobs.models import Job
from jobs.services import submitting, transitions
from tests.api.conftest import client_for


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_identical_submissions_make_exactly_one_job(submitter, monkeypatch):
    clients = [client_for(submitter), client_for(submitter)]
    # Hold both requests after their "is this key used?" check until both have made it: both
    # then insert, and only the unique constraint can keep the second job out.
    both_checked = threading.Barrier(2, timeout=20)
    first_lookup = threading.local()
    lookup = submitting._job_for_idempotency_key

    def lookup_then_wait(**kwargs):
        found = lookup(**kwargs)
        if not getattr(first_lookup, "done", False):
            first_lookup.done = True
            both_checked.wait()
        return found

    monkeypatch.setattr(submitting, "_job_for_idempotency_key", lookup_then_wait)
    monkeypatch.setattr(transitions, "job_dispatch", lambda **kwargs: None)
    responses: list = [None, None]

    def post(index: int) -> None:
        try:
            responses[index] = clients[index].post(
                "/api/jobs/", {"kind": "demo.noop", "input": {}, "idempotency_key": "race-1"}, format="json"
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200, 201], [response.json() for response in responses]
    assert responses[0].json()["id"] == responses[1].json()["id"]
    assert Job.objects.filter(owner=submitter, idempotency_key="race-1").count() == 1
