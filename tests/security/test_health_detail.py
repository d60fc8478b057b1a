"""Item 8: /healthz and /readyz answer anyone (load balancers, orchestrators) with a status only;
hostnames, PIDs, queues and exception text are for staff and for the METRICS_TOKEN."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import make_user

pytestmark = pytest.mark.django_db

TOKEN = "probe-token-0123456789"


@pytest.fixture(autouse=True)
def metrics_token(settings):
    settings.METRICS_TOKEN = TOKEN


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
@pytest.mark.parametrize("who", ["anonymous", "user", "wrong-token"])
def test_others_get_a_status_only(path, who):
    client = signed_in(make_user("someone")) if who == "user" else Client()
    headers = {"HTTP_AUTHORIZATION": "Bearer nope"} if who == "wrong-token" else {}
    response = client.get(path, **headers)
    assert response.status_code in (200, 503)
    assert set(response.json()) == {"status"}, response.json()


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_failure_is_told_to_others_without_its_exception(path, settings, tmp_path):
    settings.REDIS_URL = f"unix://{tmp_path}/nothing-listens-here.sock"
    response = Client().get(path)
    assert response.status_code == 503 and response.json() == {"status": "unavailable"}
    assert b"Error" not in response.content and str(tmp_path).encode() not in response.content


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
@pytest.mark.parametrize("who", ["staff", "token"])
def test_staff_and_the_metrics_token_get_the_detail(path, who):
    client = signed_in(make_user("operator", staff=True)) if who == "staff" else Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"} if who == "token" else {}
    body = client.get(path, **headers).json()
    detail = body["checks"] if path == "/readyz" else body
    assert detail["database"] == "ok" and detail["redis"] == "ok"
