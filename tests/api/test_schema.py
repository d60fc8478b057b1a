"""The OpenAPI document: generated without warnings, valid, served with its docs page."""

from __future__ import annotations

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db

OPERATIONS = {
    ("get", "/api/job-kinds/"),
    ("get", "/api/jobs/"),
    ("post", "/api/jobs/"),
    ("get", "/api/jobs/{id}/"),
    ("post", "/api/jobs/{id}/cancel/"),
    ("post", "/api/jobs/{id}/retry/"),
    ("get", "/api/jobs/{id}/events/"),
    ("get", "/api/questions/"),
    ("get", "/api/questions/{id}/"),
    ("post", "/api/questions/{id}/answer/"),
    ("get", "/healthz"),
}


def test_the_schema_generates_and_validates_without_warnings(tmp_path):
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


@pytest.fixture
def schema(client) -> dict:
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def test_the_schema_is_public_and_has_every_operation_of_the_contract(schema):
    found = {(method, path) for path, item in schema["paths"].items() for method in item}
    assert OPERATIONS <= found


def test_every_operation_documents_its_errors(schema):
    expected = {
        ("post", "/api/jobs/"): {"201", "200", "400", "401", "409", "429"},
        ("post", "/api/jobs/{id}/cancel/"): {"200", "401", "403", "404", "409", "429"},
        ("post", "/api/jobs/{id}/retry/"): {"200", "401", "403", "404", "409", "429"},
        ("get", "/api/jobs/{id}/events/"): {"200", "400", "401", "404", "429"},
        ("post", "/api/questions/{id}/answer/"): {"200", "400", "401", "403", "404", "409", "429"},
    }
    for (method, path), statuses in expected.items():
        responses = schema["paths"][path][method]["responses"]
        assert set(responses) == statuses, (method, path)
        for status in statuses - {"200", "201"}:
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ValidationError" if status == "400" else "/Error")
        if "429" in statuses:
            assert "Retry-After" in responses["429"]["headers"]


def test_the_docs_page_serves_swagger_ui_from_this_server(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "swagger-ui" in page and "/static/drf_spectacular_sidecar/" in page and "cdn.jsdelivr" not in page
