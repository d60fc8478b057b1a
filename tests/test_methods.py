"""Every path answers a method its view does not declare with 405 and `Allow`
(`taskplatform.methods`). The routes are read from the URL resolver, so a new route is covered
without touching this test."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RegexPattern, RoutePattern

from taskplatform.methods import path_methods

pytestmark = pytest.mark.django_db

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "QUERY", "CONNECT")
SAMPLE_ID = "8c1e6a0e-3b1f-4f6e-9d2a-7a4f2b9c0d11"
CONVERTER_SAMPLES = {"uuid": SAMPLE_ID, "int": "1"}
# For a regular expression's group, the first of these that it matches.
GROUP_SAMPLES = (SAMPLE_ID, "jobs", "1", "x")


def _fill_regex(regex: str) -> str:
    """A path a route's regular expression matches: each named group replaced by a sample."""
    text = regex.lstrip("^").rstrip("$").replace("\\Z", "")
    out, index = "", 0
    while index < len(text):
        if text.startswith("(?P<", index):
            depth, end = 0, index
            while True:  # the group's closing parenthesis
                char = text[end]
                if char == "\\":
                    end += 2
                    continue
                depth += {"(": 1, ")": -1}.get(char, 0)
                end += 1
                if depth == 0:
                    break
            inner = text[text.index(">", index) + 1:end - 1]
            out += next(sample for sample in GROUP_SAMPLES if re.fullmatch(inner, sample))
            index = end
        else:
            out += text[index + 1] if text[index] == "\\" else text[index]
            index += 2 if text[index] == "\\" else 1
    return out


def _fill_route(route: str) -> str:
    return re.sub(r"<(?:(\w+):)?\w+>", lambda m: CONVERTER_SAMPLES.get(m.group(1) or "str", "1"), route)


def _fill(pattern: RoutePattern | RegexPattern) -> str:
    if isinstance(pattern, RoutePattern):
        return _fill_route(str(pattern))
    return _fill_regex(pattern._regex)


def routes(patterns: list | None = None, prefix: str = "/") -> Iterator[tuple[str, URLPattern]]:
    """(an example path, the pattern) for every route of the project."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        path = prefix + _fill(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from routes(entry.url_patterns, path)
        else:
            yield path, entry


ROUTES = list(routes())


def test_the_walk_reaches_every_route():
    assert len(ROUTES) > 50
    for path, pattern in ROUTES:
        assert resolve(path).func is pattern.callback, (path, pattern)


@pytest.mark.parametrize("path", [path for path, _ in ROUTES])
def test_every_method_a_path_does_not_declare_answers_405_with_allow(client, path):
    allowed = path_methods(path)
    assert allowed and "TRACE" not in allowed and "CONNECT" not in allowed
    for method in METHODS:
        if method in allowed:
            continue
        response = client.generic(method, path)
        assert response.status_code == 405, (method, path, response.status_code)
        assert response["Allow"] == ", ".join(allowed), (method, path)
        if method != "HEAD":  # a HEAD answer has no body
            assert response.json()["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "path, allowed",
    [
        ("/healthz", ("GET", "HEAD")),
        ("/readyz", ("GET",)),
        ("/metrics", ("GET",)),
        ("/jobs/", ("GET",)),
        (f"/jobs/{SAMPLE_ID}/questions/{SAMPLE_ID}/answer/", ("POST",)),
        ("/api/jobs/", ("GET", "HEAD", "POST", "OPTIONS")),
        (f"/api/jobs/{SAMPLE_ID}/cancel/", ("POST", "OPTIONS")),
        (f"/api/webhooks/{SAMPLE_ID}/", ("GET", "HEAD", "DELETE", "OPTIONS")),
        (f"/api/jobs/{SAMPLE_ID}/events/stream/", ("GET",)),
        ("/api/schema/", ("GET", "HEAD", "OPTIONS")),
        ("/admin/", ("GET", "HEAD", "POST")),  # an undecorated function view: what Django's forms use
    ],
)
def test_what_each_kind_of_view_declares(path, allowed):
    assert path_methods(path) == allowed


def test_trace_on_healthz_is_405_and_get_still_answers(client):
    assert client.generic("TRACE", "/healthz").status_code == 405
    assert client.get("/healthz").status_code == 200


def test_an_async_request_is_refused_the_same_way():
    async def post():
        return await AsyncClient().generic("POST", f"/api/jobs/{SAMPLE_ID}/events/stream/")

    response = async_to_sync(post)()
    assert response.status_code == 405 and response["Allow"] == "GET"


def test_an_unknown_path_is_still_a_404(client):
    assert client.generic("TRACE", "/no/such/path/").status_code == 404


def test_the_openapi_document_declares_what_the_server_allows(client):
    schema = client.get("/api/schema/", {"format": "json"}).json()
    for template, item in schema["paths"].items():
        path = re.sub(r"\{\w+\}", SAMPLE_ID, template)
        declared = set(path_methods(path)) - {"HEAD", "OPTIONS"}
        assert {method.upper() for method in item} == declared, template
