"""A job kind's input schema (JSON Schema 2020-12, checked with `jsonschema`) written as an
OpenAPI 3.0 Schema Object, so that the API's document says what `POST /api/jobs/` accepts.

OpenAPI 3.0 speaks an older dialect: `exclusiveMinimum` is a flag beside `minimum`, there is no
`const`, `type` is one name (`nullable` says null), `items` is required on arrays. Those are
rewritten, and `examples` becomes `example` (the first). What the dialect cannot say at all
(`if`/`then`, `patternProperties`, `prefixItems`, …) is dropped and reported, so that the caller
can warn: the document then accepts more than the server. `format` is dropped without a report:
the server does not check it (jsonschema treats it as a note unless asked), so keeping it would
make the document stricter than the server.

Two things the server adds to every kind's schema are written in too: an input is a JSON
object, and no string in it may hold the NUL character (`jobs.serializers.json_value_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Kept as they are (same meaning in both dialects).
KEPT = frozenset({
    "title", "description", "default", "multipleOf", "maximum", "minimum", "maxLength", "minLength",
    "pattern", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties", "required",
    "enum", "deprecated", "readOnly", "writeOnly",
})
# Notes that change nothing the server accepts.
IGNORED = frozenset({"$schema", "$id", "$comment", "$anchor", "$defs", "definitions", "format",
                     "contentMediaType", "contentEncoding", "contentSchema", "$vocabulary"})
# What OpenAPI 3.0 cannot say.
UNSUPPORTED = frozenset({
    "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
    "patternProperties", "prefixItems", "contains", "minContains", "maxContains", "unevaluatedItems",
    "unevaluatedProperties", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor",
})
NO_NUL = "^[^\\u0000]*$"
MAX_REF_DEPTH = 16


@dataclass
class Translation:
    schema: dict[str, Any]
    # JSON pointers (inside the input schema) of what could not be written, e.g. "/properties/a/if".
    lost: list[str] = field(default_factory=list)


def openapi_input_schema(schema: dict[str, Any]) -> Translation:
    """The OpenAPI 3.0 form of a kind's `input_schema`, with the server's own rules added."""
    translation = Translation(schema={})
    body = _translate(schema, root=schema, at="", lost=translation.lost, depth=0)
    if body.get("type") != "object":
        body = {"allOf": [body], "type": "object"} if body else {"type": "object"}
    translation.schema = body
    return translation


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """A reference into the same document (`#/$defs/name`), or None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _translate(schema: Any, *, root: dict[str, Any], at: str, lost: list[str], depth: int) -> dict[str, Any]:
    if schema is True:
        return {}
    if schema is False:
        return {"not": {}}
    if not isinstance(schema, dict):
        lost.append(at or "/")
        return {}
    out: dict[str, Any] = {}
    conjuncts: list[dict[str, Any]] = []

    def sub(value: Any, where: str) -> dict[str, Any]:
        return _translate(value, root=root, at=f"{at}/{where}", lost=lost, depth=depth)

    for key, value in schema.items():
        if key in KEPT:
            out[key] = value
        elif key in IGNORED or key.startswith("x-"):
            continue
        elif key == "$ref":
            target = _resolve(value, root) if depth < MAX_REF_DEPTH else None
            if target is None:
                lost.append(f"{at}/$ref")
            else:  # written in place; beside other keywords, a $ref is one more condition
                conjuncts.append(_translate(target, root=root, at=f"{at}/$ref", lost=lost, depth=depth + 1))
        elif key == "const":
            out["enum"] = [value]
        elif key == "examples":
            if isinstance(value, list) and value:
                out["example"] = value[0]
        elif key == "type":
            names = [value] if isinstance(value, str) else list(value)
            if "null" in names:
                out["nullable"] = True
                names.remove("null")
            if len(names) == 1:
                out["type"] = names[0]
            elif names:
                out["anyOf"] = [{"type": name} for name in names]
            else:
                out["enum"] = [None]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            continue  # below, with minimum / maximum
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [sub(item, f"{key}/{index}") for index, item in enumerate(value)]
        elif key == "not":
            out["not"] = sub(value, "not")
        elif key == "properties":
            out["properties"] = {name: sub(item, f"properties/{name}") for name, item in value.items()}
        elif key == "additionalProperties":
            out["additionalProperties"] = value if isinstance(value, bool) else sub(value, key)
        elif key == "items":
            if value is False:
                out["maxItems"] = 0
            elif value is not True:
                out["items"] = sub(value, "items")
        else:
            if key in UNSUPPORTED or not key.startswith("$"):
                lost.append(f"{at}/{key}")
            # Any other `$`-keyword is a note.

    for bound, exclusive, stricter in (("minimum", "exclusiveMinimum", max), ("maximum", "exclusiveMaximum", min)):
        if exclusive in schema:
            limit = schema[exclusive]
            if bound not in out or stricter(out[bound], limit) == limit:
                out[bound] = limit
                out[exclusive] = True
    if "const" in schema and "enum" in schema:
        out["enum"] = [item for item in schema["enum"] if item == schema["const"]]
    if out.get("type") == "array" and "items" not in out:
        out["items"] = {}
    if out.get("type") == "string" or "anyOf" in out and {"type": "string"} in out["anyOf"]:
        if "pattern" in out:
            conjuncts.append({"pattern": NO_NUL})
        else:
            out["pattern"] = NO_NUL
    if conjuncts:
        out = {**out, "allOf": [*out.get("allOf", []), *conjuncts]}
    return out
