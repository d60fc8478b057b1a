"""Per-token rate limits: 429 with Retry-After, counted in Redis so they hold across processes."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.test import override_settings

from tests.api.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def low_rate():
    """A rate of 3 a minute, counted under a key prefix of this test's own."""
    caches = {"default": {**settings.CACHES["default"], "KEY_PREFIX": f"{settings.REDIS_KEY_PREFIX}{uuid.uuid4()}"}}
    rest = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"api": "3/min"}}
    with override_settings(CACHES=caches, REST_FRAMEWORK=rest):
        yield


def test_the_fourth_request_in_a_minute_is_429_with_retry_after(low_rate, submitter):
    api = client_for(submitter)
    assert [api.get("/api/jobs/").status_code for _ in range(3)] == [200, 200, 200]
    response = api.get("/api/job-kinds/")
    assert response.status_code == 429
    assert response.json()["code"] == "throttled"
    assert 1 <= int(response["Retry-After"]) <= 60


def test_each_token_has_its_own_budget(low_rate, submitter, other):
    first, second = client_for(submitter), client_for(other)
    for _ in range(3):
        first.get("/api/jobs/")
    assert first.get("/api/jobs/").status_code == 429
    assert second.get("/api/jobs/").status_code == 200


def test_the_count_lives_in_redis(low_rate, submitter):
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches["default"]
    assert isinstance(cache, RedisCache)
    api = client_for(submitter)
    api.get("/api/jobs/")
    token_id = submitter.api_tokens.get().pk
    keys = cache._cache.get_client().keys(f"{cache.key_prefix}:*:throttle:api:token:{token_id}:*")
    assert len(keys) == 1 and int(cache._cache.get_client().get(keys[0])) == 1


def test_with_redis_down_the_limit_is_not_checked_and_submissions_go_through(submitter):
    """Redis restarting must not turn every submission into a 500 while the database is fine."""
    import socket

    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    caches = {"default": {**settings.CACHES["default"], "LOCATION": dead}}
    rest = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"api": "1/min"}}
    with override_settings(CACHES=caches, REST_FRAMEWORK=rest):
        api = client_for(submitter)
        responses = [api.post("/api/jobs/", {"kind": "demo.noop", "input": {}}, format="json") for _ in range(2)]
    assert [response.status_code for response in responses] == [201, 201]
