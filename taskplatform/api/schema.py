"""Post-processing of the generated OpenAPI document (drf-spectacular hooks, in the order of
`SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]`): what a serializer alone cannot say."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.drainage import warn
from jsonschema import Draft202012Validator

from jobs.registry import JobKind, kinds_all
from taskplatform.api.jsonschema30 import openapi_input_schema

HEALTH_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "unavailable"]},
        "database": {"type": "string", "description": "`ok`, or the error met reaching the database "
                     "(staff and the metrics token only)."},
        "redis": {"type": "string", "description": "`ok`, or the error met reaching Redis (staff and the metrics "
                  "token only)."},
    },
    "required": ["status"],
}
SUBMIT = "JobSubmit"


def add_healthz(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: document `GET /healthz` (a plain Django view)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Health"] = HEALTH_SCHEMA
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}
    result.setdefault("paths", {})["/healthz"] = {
        "get": {
            "operationId": "healthz",
            "summary": "Is the platform healthy?",
            "description": "200 when the database and Redis answer, else 503. Anyone gets the status; staff and "
                           "`Authorization: Bearer $METRICS_TOKEN` also get each check.",
            "tags": ["health"],
            "security": [],
            "responses": {
                "200": {"description": "Healthy.", "content": body},
                "503": {"description": "The database or Redis does not answer.", "content": body},
            },
        }
    }
    return result


def kind_component_name(kind_name: str, taken: set[str]) -> str:
    """`demo.sleep` → `JobSubmitDemoSleep` (a number added if two kinds spell the same)."""
    name = SUBMIT + "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", kind_name) if part)
    unique, number = name, 2
    while unique in taken:
        unique, number = f"{name}{number}", number + 1
    return unique


def _kind_variant(kind: JobKind, base: dict[str, Any]) -> dict[str, Any]:
    translation = openapi_input_schema(kind.input_schema)
    input_schema = {**translation.schema, "description": f"The input of `{kind.name}` (its `input_schema`)."}
    if translation.lost:
        warn(
            f"job kind {kind.name!r}: OpenAPI 3.0 cannot say {', '.join(translation.lost)} of its input schema; "
            "the document accepts more than the server for this kind"
        )
        input_schema["x-json-schema"] = kind.input_schema
    properties = {
        **base.get("properties", {}),
        "kind": {"type": "string", "enum": [kind.name], "description": "The kind of job to run."},
        "input": input_schema,
    }
    validator = Draft202012Validator(kind.input_schema)
    # The server reads a missing input as {}: required only when {} is not a valid input.
    required = ["kind"] if validator.is_valid({}) else ["kind", "input"]
    summary = f"Submit a `{kind.name}` job" + (f": {kind.description}" if kind.description else ".")
    variant = {"type": "object", "description": summary, "properties": properties, "required": required}
    # An example request when the kind gives an input example (JSON Schema `examples`) or takes {}.
    example_input = (kind.input_schema.get("examples") or [{}])[0]
    if validator.is_valid(example_input):
        variant["example"] = {"kind": kind.name, "input": example_input}
    return variant


def add_job_kinds(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the body of `POST /api/jobs/` is one of the registered
    kinds, each with its own input schema (`kind` is the discriminator), read from the registry
    when the document is generated. Runs after the enum hook, which would otherwise pull every
    enum of every kind's input into a shared component."""
    schemas = result.get("components", {}).get("schemas", {})
    base = schemas.get(SUBMIT)
    kinds = kinds_all()
    if base is None or not kinds:
        return result
    mapping: dict[str, str] = {}
    for kind in kinds:
        name = kind_component_name(kind.name, set(schemas))
        schemas[name] = _kind_variant(kind, base)
        mapping[kind.name] = f"#/components/schemas/{name}"
    schemas[SUBMIT] = {
        "description": f"{base.get('description', '')} One of the registered kinds (`GET /api/job-kinds/`), "
        "with an `input` that its `input_schema` accepts.".strip(),
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "kind", "mapping": mapping},
    }
    return result


BLANK = {"type": "string", "maxLength": 0}


def _accepts_blank(schema: dict[str, Any]) -> bool:
    pattern = schema.get("pattern")
    return (
        schema.get("type") == "string" and not schema.get("minLength") and "format" not in schema
        and (pattern is None or re.search(pattern, "") is not None)
    )


def single_blank_branch(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: a string that may be blank and has a `pattern` comes
    out as `oneOf: [<string>, {maxLength: 0}]`; when the first already accepts "", "" matches
    both and `oneOf` refuses it. Keep the one schema."""
    stack: list[Any] = [result]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        branches = node.get("oneOf")
        if isinstance(branches, list) and len(branches) == 2 and branches[1] == BLANK and _accepts_blank(branches[0]):
            del node["oneOf"]
            node.update(branches[0])
        stack.extend(node.values())
    return result


def add_request_too_large(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Every operation that takes a body may answer 413 (`request_too_large`: the body is over
    REQUEST_BODY_MAX_BYTES), before the view ever sees it: the document says so."""
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                operation.setdefault("responses", {}).setdefault("413", {
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                    "description": "The body is over REQUEST_BODY_MAX_BYTES (`request_too_large`).",
                })
    return result
