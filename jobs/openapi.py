"""The registered job kinds in the OpenAPI document (a drf-spectacular post-processing hook).

Each kind's input schema (derived from its pydantic model for a typed kind) becomes a component
`JobInput.<kind>`, its result schema `JobResult.<kind>`, and the body of `POST /api/jobs/` is one
of `{"kind": "<kind>", "input": JobInput.<kind>}`: a client generated from the document knows
every kind's input. The kinds' schemas are JSON Schema 2020-12; the document is OpenAPI 3.0, so
they are written in its dialect (`nullable`, a boolean `exclusiveMinimum`, `enum` for `const`),
leaving out what it cannot say (`if`/`then`): the API itself validates against the full schema.
"""

from __future__ import annotations

import re
from typing import Any

from jobs.registry import kinds_all

SUBMIT_PATH = "/api/jobs/"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Keywords of JSON Schema 2020-12 with no place in an OpenAPI 3.0 schema object.
_DROPPED = {"$schema", "$id", "$defs", "$comment", "if", "then", "else", "prefixItems", "dependentRequired",
            "dependentSchemas", "unevaluatedProperties", "unevaluatedItems", "contentEncoding",
            "contentMediaType", "propertyNames", "contains", "minContains", "maxContains", "examples", "const"}
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def component_name(prefix: str, kind: str) -> str:
    return f"{prefix}.{_UNSAFE.sub('_', kind)}"


def add_job_kind_schemas(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the kinds' input and result schemas, and the submit
    body as one of them per kind."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    variants = []
    for kind in kinds_all():
        input_name = component_name("JobInput", kind.name)
        schemas[input_name] = {**to_openapi_30(kind.input_schema), "description": _describe(kind)}
        if kind.result_schema is not None:
            schemas[component_name("JobResult", kind.name)] = to_openapi_30(kind.result_schema)
        variants.append({
            "type": "object",
            "properties": {
                "kind": {"type": "string", "enum": [kind.name]},
                "input": {"$ref": f"#/components/schemas/{input_name}"},
            },
            "required": ["kind"],
        })
    submit = result.get("paths", {}).get(SUBMIT_PATH, {}).get("post")
    if submit and variants:
        for media in submit.get("requestBody", {}).get("content", {}).values():
            base = media.get("schema")
            if base:
                media["schema"] = {"allOf": [base, {"oneOf": variants}]}
    return result


def _describe(kind: Any) -> str:
    typed = f" (derived from `{kind.input_model.__name__}`)" if kind.input_model is not None else ""
    return f"The input of `{kind.name}`{typed}. {kind.description}".strip()


def to_openapi_30(schema: Any) -> Any:
    """A JSON Schema 2020-12 in the dialect of OpenAPI 3.0's schema object."""
    if isinstance(schema, list):
        return [to_openapi_30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED or key.startswith("x-"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: to_openapi_30(prop) for name, prop in value.items()} if isinstance(value, dict) else value
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_openapi_30(value)
        elif key in _SUBSCHEMA_LISTS:
            options = [option for option in value if option != {"type": "null"}]
            if len(options) < len(value):
                out["nullable"] = True
            if len(options) == 1:
                out.update(to_openapi_30(options[0]))
            elif options:
                out[key] = to_openapi_30(options)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "type" and isinstance(value, list):
            types = [item for item in value if item != "null"]
            if len(types) < len(value):
                out["nullable"] = True
            if len(types) == 1:
                out["type"] = types[0]
        else:
            out[key] = value
    if "const" in schema:
        out["enum"] = [schema["const"]]
    return out
