"""The OpenAPI document: generated without warnings, valid, served with its docs page, and
saying what the server accepts (what it allows, the server accepts; what it refuses, the server
refuses)."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from jsonschema import Draft4Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from jobs.registry import kinds_all
from webhooks.serializers import WebhookCreateSerializer, webhook_url_pattern

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
        ("post", "/api/jobs/"): {"201", "200", "400", "401", "409", "413", "429"},
        ("post", "/api/jobs/{id}/cancel/"): {"200", "401", "403", "404", "409", "429"},
        ("post", "/api/jobs/{id}/retry/"): {"200", "401", "403", "404", "409", "429"},
        ("get", "/api/jobs/{id}/events/"): {"200", "400", "401", "404", "429"},
        ("post", "/api/questions/{id}/answer/"): {"200", "400", "401", "403", "404", "409", "413", "429"},
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


# -- the document says what the server accepts -------------------------------------------------
def body_validator(schema: dict, component: str) -> Draft4Validator:
    """A validator of a request body against the document's `component` (OpenAPI 3.0 speaks
    JSON Schema draft 4, `nullable` aside)."""
    registry = Registry().with_resource("urn:openapi", Resource.from_contents(schema, default_specification=DRAFT4))
    return Draft4Validator({"$ref": f"urn:openapi#/components/schemas/{component}"}, registry=registry)


def test_the_submit_body_is_one_variant_per_registered_kind(schema):
    submit = schema["components"]["schemas"]["JobSubmit"]
    mapping = submit["discriminator"]["mapping"]
    assert submit["discriminator"]["propertyName"] == "kind"
    assert sorted(mapping) == [kind.name for kind in kinds_all()]
    assert [item["$ref"] for item in submit["oneOf"]] == list(mapping.values())
    sleep = schema["components"]["schemas"][mapping["demo.sleep"].rsplit("/", 1)[1]]
    assert sleep["properties"]["kind"]["enum"] == ["demo.sleep"]
    assert sleep["properties"]["input"]["properties"]["steps"] == {"type": "integer", "minimum": 1, "maximum": 1000}
    assert sleep["required"] == ["kind", "input"]  # {} is not a valid input of demo.sleep
    noop = schema["components"]["schemas"][mapping["demo.noop"].rsplit("/", 1)[1]]
    assert noop["required"] == ["kind"] and noop["example"] == {"kind": "demo.noop", "input": {}}


@pytest.mark.parametrize(
    "body, valid",
    [
        ({"kind": "demo.noop"}, True),
        ({"kind": "demo.sleep", "input": {"seconds": 1, "steps": 2}, "idempotency_key": " k "}, True),
        ({"kind": "demo.expense", "input": {"employee": "D", "amount": 0.5, "description": ""}}, True),
        ({"kind": ""}, False),  # the first case
        ({"kind": "demo.nothing"}, False),
        ({"kind": "demo.sleep", "input": {}}, False),
        ({"kind": "demo.sleep", "input": {"seconds": 1, "steps": 0}}, False),
        ({"kind": "demo.expense", "input": {"employee": "D", "amount": 0, "description": ""}}, False),
        ({"kind": "demo.noop", "input": {"extra": 1}}, False),
        ({"kind": "demo.noop", "idempotency_key": ""}, False),
        ({"kind": "demo.noop", "idempotency_key": "k" * 201}, False),
        ({"kind": "demo.noop", "idempotency_key": "k\x00"}, False),
    ],
)
def test_a_submit_the_document_allows_is_one_the_server_accepts(schema, api, dispatched, body, valid):
    assert body_validator(schema, "JobSubmit").is_valid(body) is valid
    response = api.post("/api/jobs/", body, format="json")
    assert (response.status_code == 201) is valid, response.json()


@pytest.mark.parametrize(
    "url, valid",
    [
        ("https://hooks.example.com/jobs", True),
        ("HTTP://A.B.CO:65535/x?y=1#z", True),
        ("https://" + "a" * 63 + ".com", True),
        ("https://" + ("a" * 63 + ".") * 3 + "a" * 61 + "/" + "p" * 1700, True),  # host of 253
        ("https://x.xn--p1ai/", True),
        ("https://" + ".".join(["a" * 63] * 30) + ".com/", False),  # the second case: a 1,923-character host
        ("https://" + ("a" * 63 + ".") * 3 + "a" * 62, False),  # host of 254
        ("https://" + "a" * 64 + ".com", False),  # a label of 64
        ("https://-a.com", False),
        ("https://a-.com", False),
        ("https://a.c", False),
        ("https://a.c0m", False),
        ("https://a.com:65536", False),
        ("https://a.com:", False),
        ("https://user:pw@a.com", False),
        ("ftp://a.com", False),
        ("https://a.com/\x1f", False),  # whitespace to Python (the server), not to ECMA's \s
        ("https://a.com/ x", False),
        ("https://x.localhost/", False),
        ("https://a.com/" + "p" * 1990, False),  # 2005 characters
    ],
)
def test_a_webhook_url_the_document_allows_is_one_the_server_accepts(schema, api, url, valid):
    body = {"url": url, "events": ["completed"]}
    assert body_validator(schema, "WebhookCreate").is_valid(body) is valid
    response = api.post("/api/webhooks/", body, format="json")
    assert (response.status_code == 201) is valid, response.json()


def test_a_public_ip_address_is_the_one_url_the_server_takes_beyond_the_pattern(schema, api):
    body = {"url": "https://93.184.216.34/hook", "events": ["completed"]}
    assert not body_validator(schema, "WebhookCreate").is_valid(body)
    assert api.post("/api/webhooks/", body, format="json").status_code == 201


def test_the_webhook_url_pattern_says_https_when_the_server_requires_it(client, settings):
    settings.WEBHOOKS_REQUIRE_HTTPS = True
    pattern = client.get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]["WebhookCreate"][
        "properties"]["url"]["pattern"]
    assert re.search(pattern, "https://a.com/") and not re.search(pattern, "http://a.com/")


@hypothesis_settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_url_drawn_from_the_pattern_is_accepted(data):
    url = data.draw(st.from_regex(re.compile(webhook_url_pattern().replace("$", r"\Z")), fullmatch=True))
    assume(len(url) <= 2000)
    assert WebhookCreateSerializer(data={"url": url, "events": ["failed"]}).is_valid(), url


def test_every_path_id_is_a_uuid(schema):
    """Jobs, questions and webhooks are named by UUIDs; waits, numbered by the database, by whole
    numbers. Either way the document says which."""
    for path, item in schema["paths"].items():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "id":
                    expected = ({"type": "string", "pattern": "^[0-9]{1,18}$"} if path.startswith("/api/waits/")
                                else {"type": "string", "format": "uuid"})
                    assert parameter["schema"] == expected, path


def test_request_strings_say_what_they_refuse(schema):
    components = schema["components"]["schemas"]
    comment = components["Answer"]["properties"]["comment"]
    assert comment == {"type": "string", "default": "", "maxLength": 10000, "pattern": "^[^\\u0000]*$"}
    key = components["JobSubmitDemoNoop"]["properties"]["idempotency_key"]
    assert key["minLength"] == 1 and key["maxLength"] == 200 and key["pattern"] == "^[^\\u0000]*$"
    kind_filter = next(p for p in schema["paths"]["/api/jobs/"]["get"]["parameters"] if p["name"] == "kind")
    assert kind_filter["schema"]["minLength"] == 1 and kind_filter["schema"]["maxLength"] == 100
