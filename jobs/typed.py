"""Typed job code: pydantic models (or any type pydantic understands) as a kind's input and
result, a question's answer, a wait's result, a child's result.

The JSON Schema is derived from the type (`schema_of`): it is what the API validates against and
what OpenAPI, the admin and the job page show. Values are stored as JSON (`to_json`) and come
back as instances of the type (`from_json`). Plain JSON Schemas keep working: a model is an
option, never a requirement.

    class ReviewInput(BaseModel):
        model_config = ConfigDict(extra="forbid")     # derived schema: "additionalProperties": false
        document: str

    @job_kind("demo.review")
    def review(ctx, input: ReviewInput) -> ReviewResult: ...
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

__all__ = ["ValidationError", "error_field", "from_json", "is_model", "schema_of", "to_json"]


def is_model(value: Any) -> bool:
    """Is `value` a pydantic model class?"""
    return isinstance(value, type) and issubclass(value, BaseModel)


@lru_cache(maxsize=512)
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


def _adapter_for(tp: Any) -> TypeAdapter:
    try:
        return _adapter(tp)
    except TypeError:  # an unhashable type expression: build it each time
        return TypeAdapter(tp)


def schema_of(tp: Any) -> dict:
    """The JSON Schema (2020-12) of `tp`, self-contained and plain enough for forms and OpenAPI.

    pydantic's own schema, with its `$defs` inlined (unless a model refers to itself) and an
    optional field (`x: T | None = None`) shown as a `T` that may be left out, which is how a
    form or an API client sees it.
    """
    schema = tp.model_json_schema() if is_model(tp) else _adapter_for(tp).json_schema()
    return _simplify(schema)


def to_json(value: Any, *, unset: bool = True) -> Any:
    """`value` as plain JSON data: models dumped in JSON mode (dates as ISO strings, enums as
    their values, by alias), an optional field left at None left out (the derived schema
    describes it as "may be absent", not as null), anything else as it is. With `unset=False`
    a model's fields left at their defaults are left out too (a job's input: what was given)."""
    if isinstance(value, BaseModel):
        return _dump(value, exclude_unset=not unset)
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()} if _holds_model(value) else value
    if isinstance(value, (list, tuple)) and _holds_model(list(value)):
        return [to_json(item) for item in value]
    if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
        return value
    return to_jsonable_python(value)


def _dump(model: BaseModel, *, exclude_unset: bool = False) -> dict:
    data = model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=exclude_unset)
    for name, info in type(model).model_fields.items():
        if info.is_required() and getattr(model, name) is None:  # a required field that takes null
            data[info.alias or name] = None
    return data


def from_json(tp: Any, data: Any) -> Any:
    """`data` (JSON) as an instance of `tp`; raises `pydantic.ValidationError`."""
    if is_model(tp):
        return tp.model_validate(data)
    return _adapter_for(tp).validate_python(data)


def error_field(error: ValidationError, prefix: str) -> tuple[str, str]:
    """The first error of `error` as `(field, message)`, the field named from `prefix`
    (`input.amount`, `answer.reason`)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    field = f"{prefix}.{where}" if where else prefix
    return field, first.get("msg", str(error))


def _holds_model(value: Any) -> bool:
    if isinstance(value, BaseModel):
        return True
    if isinstance(value, dict):
        return any(_holds_model(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_model(item) for item in value)
    return False


class _Recursive(Exception):  # noqa: N818
    pass


def _simplify(schema: dict) -> dict:
    defs = schema.get("$defs") or {}
    body = {key: value for key, value in schema.items() if key != "$defs"}
    try:
        return _inline(body, defs, frozenset())
    except _Recursive:  # a model that contains itself: keep pydantic's references
        return schema


def _inline(node: Any, defs: dict, seen: frozenset[str]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in seen or name not in defs:
            raise _Recursive(name)
        target = _inline(copy.deepcopy(defs[name]), defs, seen | {name})
        rest = {key: _inline(value, defs, seen) for key, value in node.items() if key != "$ref"}
        return {**target, **rest}
    out = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _inline(prop, defs, seen) for name, prop in value.items()}
        else:
            out[key] = _inline(value, defs, seen)
    if isinstance(out.get("properties"), dict):
        required = set(out.get("required") or [])
        out["properties"] = {
            name: prop if name in required else _optional(prop) for name, prop in out["properties"].items()
        }
    return out


def _optional(prop: Any) -> Any:
    """`{"anyOf": [T, {"type": "null"}], "default": null, ...}` as `{...T, ...}`: a field that may be
    left out rather than one that takes null."""
    if not isinstance(prop, dict) or prop.get("default", ...) is not None:
        return prop
    options = prop.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or {"type": "null"} not in options:
        return prop
    [kept] = [option for option in options if option != {"type": "null"}]
    extra = {key: value for key, value in prop.items() if key not in ("anyOf", "default")}
    return {**kept, **extra}
