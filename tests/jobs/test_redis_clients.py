"""REDIS_URL may name Sentinels: each client library gets the form it understands, and a mistake
in the URL is an error that says what is wrong."""

from __future__ import annotations

import pytest

from jobs.redis_clients import channel_layer_host, sentinel_target
from taskplatform.redis_urls import broker_transport_options_for, redis_url_for_celery

URL = "sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380,sentinel-3/2?master_name=main&sentinel_password=sp"


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_db():
    target = sentinel_target(URL)
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel-3", 26379))
    assert (target.master_name, target.db, target.password, target.sentinel_password) == ("main", 2, "s3cret", "sp")


def test_a_plain_url_is_not_a_sentinel_url():
    assert sentinel_target("redis://127.0.0.1:6379/0") is None
    assert sentinel_target("unix:///var/run/redis.sock?db=1") is None


@pytest.mark.parametrize("url, says", [
    ("sentinel:///0?master_name=m", "at least one Sentinel"),
    ("sentinel://h:26379/0", "master_name"),
    ("sentinel://h:port/0?master_name=m", "no valid port"),
    ("sentinel://h:26379/zero?master_name=m", "not a number"),
])
def test_a_bad_sentinel_url_says_what_is_wrong(url, says):
    with pytest.raises(ValueError, match=says):
        sentinel_target(url)


def test_the_broker_gets_kombus_sentinel_transport():
    assert redis_url_for_celery(URL) == (
        "sentinel://:s3cret@10.0.0.1:26379/2;sentinel://:s3cret@10.0.0.2:26380/2;sentinel://:s3cret@sentinel-3:26379/2"
    )
    assert broker_transport_options_for(URL) == {"master_name": "main", "sentinel_kwargs": {"password": "sp"}}
    assert broker_transport_options_for("redis://h:6379/0") == {}


def test_the_channel_layer_gets_channels_redis_sentinel_host():
    host = channel_layer_host(URL, socket_timeout=30, max_connections=100, timeout=10)
    assert host == {"sentinels": [["10.0.0.1", 26379], ["10.0.0.2", 26380], ["sentinel-3", 26379]],
                    "master_name": "main", "db": 2, "socket_timeout": 30, "password": "s3cret",
                    "sentinel_kwargs": {"password": "sp"}}
    assert channel_layer_host("redis://h:6379/0", socket_timeout=30) == {"address": "redis://h:6379/0",
                                                                       "socket_timeout": 30}


def test_the_cache_keeps_one_client_per_pool_and_it_works():
    """Django builds a `redis.Redis` for every cache call; ours is built once per pool (the API's
    throttle asks the cache on every request)."""
    from django.core.cache import cache

    first = cache._cache.get_client("k", write=True)
    assert cache._cache.get_client("other", write=True) is first
    assert cache._cache.get_client("k") is first  # one server: reads use the same pool
    cache.set("redis-clients:kept", 7, 30)
    assert cache.get("redis-clients:kept") == 7
    cache.delete("redis-clients:kept")
