"""Question types: the answer schema of each, and helpers for job authors.

Every answer is checked against its question's JSON Schema on the server, on every path (admin,
bulk action, API, job page), before the job resumes. The helpers below build those schemas and
mark them with `x-question` so the admin knows which form to draw:

    ctx.ask("approve", "Pay this invoice?", schema=approval())
    ctx.ask("route", "Which team?", schema=choice(["billing", "support"]))
    ctx.ask("tags", "Tags?", schema=multiple_choice(["urgent", "legal", "vip"], min_items=1, max_items=2))
    ctx.ask("note", "Anything to add?", schema=text(max_length=500))
    ctx.ask("fix", "Correct the amounts", schema=form({"type": "object", "properties": {...}}))

A schema written by hand works too: its type is recognised from its shape (`question_type`).
So does a type: `ctx.ask(..., answer=Model)` derives the schema from a pydantic model (a flat
one is a form), an `Enum` or `Literal` (a choice), and returns the answer as that type; the
models `Approval` and `ApprovalWithReason` are the approve/reject schemas below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs import typed

# How a schema's shape is read (the order of properties, choices, flat objects) is shared with the
# jobs core's schema forms, which draw a kind's input the same way an answer form is drawn.
from jobs.forms import FLAT_TYPES, ORDER_KEY, choice_options, is_flat_object, ordered_properties

__all__ = [
    "APPROVAL_SCHEMA", "FLAT_TYPES", "ORDER_KEY", "QUESTION_TYPE_KEY", "QuestionType", "approval", "choice",
    "choice_options", "form", "is_approval", "is_flat_object", "multiple_choice", "ordered_properties",
    "question_type", "schema_summary", "text",
]

QUESTION_TYPE_KEY = "x-question"


class QuestionType:
    APPROVAL = "approval"
    CHOICE = "choice"
    MULTIPLE_CHOICE = "multiple_choice"
    TEXT = "text"
    FORM = "form"

    LABELS = {
        APPROVAL: "approve or reject",
        CHOICE: "single choice",
        MULTIPLE_CHOICE: "multiple choice",
        TEXT: "free text",
        FORM: "form",
    }


# The longest reason of an approval or rejection (the approval schemas' default, the admin's bulk reason).
REASON_MAX_LENGTH = 2000

# Approve or reject, with an optional reason. The default schema of `ctx.ask` and the schema of
# `demo.review`; kept exactly as it was, because a question's digest covers its schema and a
# paused job asked with it must still find its answer.
APPROVAL_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 2000},
    },
    "required": ["approved"],
    "additionalProperties": False,
}


def approval(*, reason_max_length: int = REASON_MAX_LENGTH) -> dict:
    """Approve or reject; a reason is required to reject (`{"approved": false, "reason": "..."}`).

    This is the type that quorum questions (`required_approvals > 1`) use.
    """
    return {
        QUESTION_TYPE_KEY: QuestionType.APPROVAL,
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "reason": {"type": "string", "maxLength": reason_max_length},
        },
        "required": ["approved"],
        "additionalProperties": False,
        # JSON Schema's own conditional: a rejection must say why.
        "if": {"properties": {"approved": {"const": False}}, "required": ["approved"]},
        "then": {"properties": {"reason": {"minLength": 1}}, "required": ["reason"]},
    }


def _exactly(schema: dict):
    """A pydantic `json_schema_extra` that makes a model's JSON Schema exactly `schema`, so a
    typed question's digest (and form) is the same as the hand-written one's."""

    def replace(derived: dict[str, Any], cls: Any = None) -> None:
        derived.clear()
        derived.update(schema)

    return replace


class Approval(BaseModel):
    """`ctx.ask(key, prompt, answer=Approval)`: approve or reject with an optional reason; the
    question's schema is `APPROVAL_SCHEMA` (the default of `ctx.ask`)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_exactly(APPROVAL_SCHEMA))

    approved: bool
    reason: str | None = Field(default=None, max_length=2000)


class ApprovalWithReason(Approval):
    """`ctx.ask(key, prompt, answer=ApprovalWithReason)`: approve, or reject with a reason; the
    question's schema is `approval()`. The type quorum questions use."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_exactly(approval()))

    @model_validator(mode="after")
    def _reason_to_reject(self) -> ApprovalWithReason:
        if not self.approved and not (self.reason or "").strip():
            raise ValueError("a rejection needs a reason")
        return self


def answer_schema(answer_type: Any) -> dict:
    """The question schema of `ctx.ask(..., answer=answer_type)`: derived from the type (see
    `jobs.typed.schema_of`), marked as a form when it is an object that no other question type
    recognises, so the admin draws one field per property in the model's order."""
    schema = typed.schema_of(answer_type)
    if question_type(schema) == QuestionType.FORM and isinstance(schema.get("properties"), dict):
        schema = form(schema)
    return schema


def _options(options: Sequence[Any] | dict[Any, str]) -> list[dict[str, Any]]:
    """`["a", "b"]` or `{"a": "Label A"}` as `oneOf` of `const`s with titles."""
    pairs = list(options.items()) if isinstance(options, dict) else [(value, str(value)) for value in options]
    if not pairs:
        raise ValueError("a choice needs at least one option")
    values = [value for value, _ in pairs]
    if len({repr(value) for value in values}) != len(values):
        raise ValueError(f"the options of a choice must be distinct: {values!r}")
    return [{"const": value, "title": str(title)} for value, title in pairs]


def choice(options: Sequence[Any] | dict[Any, str]) -> dict:
    """Exactly one of `options` (a list of values, or a dict of value → label); the answer is the value."""
    return {QUESTION_TYPE_KEY: QuestionType.CHOICE, "oneOf": _options(options)}


def multiple_choice(
    options: Sequence[Any] | dict[Any, str], *, min_items: int = 0, max_items: int | None = None
) -> dict:
    """Some of `options`, at least `min_items` and at most `max_items`; the answer is a list of values."""
    choices = _options(options)
    too_few = min_items < 0 or min_items > len(choices)
    if too_few or (max_items is not None and (max_items < max(min_items, 1) or max_items > len(choices))):
        raise ValueError(f"min_items={min_items}, max_items={max_items} do not fit {len(choices)} option(s)")
    schema: dict[str, Any] = {
        QUESTION_TYPE_KEY: QuestionType.MULTIPLE_CHOICE,
        "type": "array",
        "items": {"oneOf": choices},
        "uniqueItems": True,
        "minItems": min_items,
    }
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema


def text(*, max_length: int = 5000, min_length: int = 1) -> dict:
    """A free-text answer of at most `max_length` characters; the answer is the string."""
    if max_length < 1 or min_length < 0 or min_length > max_length:
        raise ValueError(f"min_length={min_length}, max_length={max_length} make no sense")
    return {QUESTION_TYPE_KEY: QuestionType.TEXT, "type": "string", "minLength": min_length, "maxLength": max_length}


def form(schema: dict) -> dict:
    """Any JSON Schema of an object; flat ones are drawn as a form of fields in the admin, nested
    ones as a JSON text area. The answer is the object."""
    Draft202012Validator.check_schema(schema)
    marked = {QUESTION_TYPE_KEY: QuestionType.FORM, **schema}
    if isinstance(schema.get("properties"), dict):
        # PostgreSQL's jsonb does not keep the order of an object's keys; a list does.
        marked[ORDER_KEY] = list(schema["properties"])
    return marked


def is_approval(schema: dict) -> bool:
    """True for schemas whose answer is an approve/reject decision (rendered as two buttons)."""
    props = schema.get("properties") or {}
    return schema.get("type") == "object" and props.get("approved", {}).get("type") == "boolean"


def question_type(schema: dict) -> str:
    """Which type a schema is: its `x-question` mark, else recognised from its shape."""
    marked = schema.get(QUESTION_TYPE_KEY)
    if marked in QuestionType.LABELS:
        return marked
    if is_approval(schema):
        return QuestionType.APPROVAL
    if choice_options(schema):
        return QuestionType.CHOICE
    if schema.get("type") == "array" and choice_options(schema.get("items") or {}):
        return QuestionType.MULTIPLE_CHOICE
    if schema.get("type") == "string":
        return QuestionType.TEXT
    return QuestionType.FORM


def schema_summary(schema: dict) -> str:
    """One line for people: what kind of answer the question wants."""
    kind = question_type(schema)
    if kind == QuestionType.CHOICE:
        return f"single choice of: {', '.join(label for _, label in choice_options(schema))}"
    if kind == QuestionType.MULTIPLE_CHOICE:
        labels = ", ".join(label for _, label in choice_options(schema.get("items") or {}))
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        bounds = f"at least {low}" + (f", at most {high}" if high is not None else "")
        return f"multiple choice ({bounds}) of: {labels}"
    if kind == QuestionType.TEXT:
        return f"free text, at most {schema.get('maxLength', '∞')} characters"
    if kind == QuestionType.APPROVAL:
        required = "then" in schema
        return "approve or reject" + (" (a reason is required to reject)" if required else " (reason optional)")
    names = ", ".join(name for name, _ in ordered_properties(schema))
    return f"form: {names}" if names else "a JSON value matching the schema"
