"""A kind's input schema (JSON Schema 2020-12) written for the OpenAPI 3.0 document
(`taskplatform.api.jsonschema30`), and the warning when part of it cannot be."""

from __future__ import annotations

import pytest
from jsonschema import Draft4Validator, Draft202012Validator

from jobs import registry
from jobs.registry import JobKind
from taskplatform.api import schema as schema_hooks
from taskplatform.api.jsonschema30 import NO_NUL, openapi_input_schema


def test_the_2020_12_words_become_their_3_0_spelling():
    translation = openapi_input_schema({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            "cap": {"type": "number", "minimum": 5, "exclusiveMinimum": 3},
            "mode": {"const": "fast"},
            "note": {"type": ["string", "null"], "format": "email", "examples": ["a@b.c"]},
            "tags": {"type": "array"},
            "any": {"type": ["integer", "string"]},
        },
        "additionalProperties": False,
    })
    assert translation.lost == []
    properties = translation.schema["properties"]
    assert properties["amount"] == {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 10}
    assert properties["cap"] == {"type": "number", "minimum": 5}  # the inclusive 5 is the stricter
    assert properties["mode"] == {"enum": ["fast"]}
    assert properties["note"] == {"type": "string", "nullable": True, "example": "a@b.c", "pattern": NO_NUL}
    assert properties["tags"] == {"type": "array", "items": {}}
    assert properties["any"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert translation.schema["additionalProperties"] is False


def test_a_local_reference_is_written_in_place():
    translation = openapi_input_schema({
        "type": "object",
        "properties": {"when": {"$ref": "#/$defs/time"}},
        "$defs": {"time": {"type": "integer", "minimum": 0}},
    })
    assert translation.lost == []
    assert translation.schema["properties"]["when"] == {"allOf": [{"type": "integer", "minimum": 0}]}
    assert "$defs" not in translation.schema


def test_what_3_0_cannot_say_is_reported():
    translation = openapi_input_schema({
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "if": {"required": ["a"]},
        "then": {"required": ["b"]},
        "patternProperties": {"^x": {"type": "integer"}},
    })
    assert sorted(translation.lost) == ["/if", "/patternProperties", "/then"]


@pytest.mark.parametrize("schema", [{}, {"type": "array"}, True])
def test_an_input_is_always_an_object(schema):
    translated = openapi_input_schema(schema).schema
    assert translated["type"] == "object"


@pytest.mark.parametrize(
    "value",
    [{"amount": 1}, {"amount": 0}, {"amount": 11}, {"amount": "1"}, {"note": None}, {"note": "x"}, {}, {"x": 1}],
)
def test_the_translation_accepts_what_jsonschema_accepts(value):
    original = {
        "type": "object",
        "properties": {"amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
                       "note": {"type": ["string", "null"]}},
        "additionalProperties": False,
    }
    translated = openapi_input_schema(original).schema
    # Draft 4 is OpenAPI 3.0's dialect; it does not know `nullable`, which the null case needs.
    if value.get("note", "") is None:
        translated["properties"]["note"] = {"type": ["string", "null"]}
    assert Draft4Validator(translated).is_valid(value) == Draft202012Validator(original).is_valid(value)


def test_a_kind_the_document_cannot_describe_is_a_warning_and_keeps_its_schema(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(schema_hooks, "warn", warnings.append)
    odd = {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}
    monkeypatch.setitem(registry._kinds, "test.odd", JobKind(name="test.odd", handler=lambda ctx, input: None,
                                                              input_schema=odd))
    variant = schema_hooks._kind_variant(registry.kind_get("test.odd"), {"properties": {}})
    assert warnings and "test.odd" in warnings[0] and "/if" in warnings[0]
    assert variant["properties"]["input"]["x-json-schema"] == odd
