"""The API's floor that `bench/shipped.py` measures beside `POST /api/jobs/` (its `api-floor`
phase): the bench's endpoint writes a job as the platform's bench tables hold it and sends its
message to the bare + SQL worker's queue, behind the API's own token check."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.api.conftest import client_for
from tests.conftest import make_user

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the bench's tables are PostgreSQL's"),
    pytest.mark.django_db,
]


@pytest.fixture
def floor(settings):
    from bench import bare_durable

    settings.ROOT_URLCONF = "bench.api_urls"
    with connection.cursor() as cursor:
        bare_durable.create_tables(cursor)
    before = bare_durable.app.conf.broker_url
    bare_durable.app.conf.broker_url = settings.CELERY_BROKER_URL
    # The queue starts empty: a message left by anything else (a bench run on the same Redis) is
    # not taken for this test's.
    with bare_durable.app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        client.delete("durable")
    yield bare_durable
    with bare_durable.app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        client.delete("durable")
    bare_durable.app.conf.broker_url = before


def test_the_floor_writes_the_job_and_its_event_and_sends_its_message(floor):
    bare_durable = floor
    api = client_for(make_user("integration"))
    response = api.post("/bench/floor/", {"kind": "demo.noop", "input": {"n": 1}}, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, input FROM {bare_durable.JOBS} WHERE id = %s", [job_id])
        status, stored = cursor.fetchone()
        assert (status, json.loads(stored)) == ("pending", {"n": 1})  # Django's cursor reads jsonb as text
        cursor.execute(f"SELECT seq, status FROM {bare_durable.EVENTS} WHERE job_id = %s", [job_id])
        assert cursor.fetchall() == [(1, "pending")]
    with bare_durable.app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        message = json.loads(client.rpop("durable"))
    assert message["headers"]["task"] == "durable.run" and message["headers"]["argsrepr"] == repr([job_id])


def test_the_floor_checks_the_token_as_the_api_does(floor):
    from rest_framework.test import APIClient

    anonymous = APIClient().post("/bench/floor/", {"kind": "demo.noop"}, format="json")
    assert anonymous.status_code in (401, 403)
    bad = client_for(make_user("integration")).post("/bench/floor/", {"input": {}}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "kind"
