"""GET /healthz answers for the real database and Redis."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(client, settings):
    """The detail is for staff and the METRICS_TOKEN (tests/security/test_health_detail.py)."""
    settings.METRICS_TOKEN = "healthz-probe-token"
    client.defaults["HTTP_AUTHORIZATION"] = "Bearer healthz-probe-token"
    return client


def test_healthz_is_ok_when_database_and_redis_answer(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_healthz_is_503_naming_redis_when_it_does_not_answer(client, settings, tmp_path):
    settings.REDIS_URL = f"unix://{tmp_path}/nothing-listens-here.sock"
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["database"] == "ok" and body["redis"].startswith("error")
