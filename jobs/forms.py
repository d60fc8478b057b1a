"""Forms drawn from a JSON Schema: one field per property of a flat object (text, number,
checkbox, select, checkboxes), JSON only where the schema nests deeper than fields can show.

Two users: the "Submit a job" form of `/jobs/`, drawn from a kind's input schema, and the answer
forms of `approvals.forms` (a question's answer schema), which build their fields with the same
functions. The forms only turn posted fields into JSON; the JSON is then checked against the
schema by the service that takes it (`job_submit`, `question_answer`), as on every other path.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.html import escape
from django.utils.text import capfirst

from jobs.errors import PlatformError
from jobs.json_input import json_parse
from jobs.registry import JobKind

TEXTAREA = {"rows": 3, "cols": 60}
# The order of an object's properties as its author wrote them (jsonb does not keep key order).
ORDER_KEY = "x-order"
FLAT_TYPES = frozenset({"string", "integer", "number", "boolean"})


# -- reading a schema ----------------------------------------------------------------------------
def ordered_properties(schema: dict) -> list[tuple[str, dict]]:
    """The object schema's properties in the author's order (`x-order`), then the rest."""
    properties = schema.get("properties") or {}
    order = [name for name in schema.get(ORDER_KEY) or [] if name in properties]
    return [(name, properties[name]) for name in order + [name for name in properties if name not in order]]


def choice_options(schema: dict) -> list[tuple[Any, str]]:
    """The `(value, label)` pairs of a choice schema (`oneOf` of consts, or `enum`); [] for others."""
    if isinstance(schema.get("oneOf"), list) and all(isinstance(o, dict) and "const" in o for o in schema["oneOf"]):
        return [(option["const"], str(option.get("title", option["const"]))) for option in schema["oneOf"]]
    if isinstance(schema.get("enum"), list):
        return [(value, str(value)) for value in schema["enum"]]
    return []


def is_flat_object(schema: dict) -> bool:
    """An object schema whose properties are all scalars (or lists of choices): drawn as a form."""
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        return False
    if not schema["properties"]:
        return False
    for prop in schema["properties"].values():
        if not isinstance(prop, dict):
            return False
        if prop.get("type") in FLAT_TYPES or (choice_options(prop) and "type" not in prop):
            continue
        if prop.get("type") == "array" and choice_options(prop.get("items") or {}):
            continue
        return False
    return True


# -- fields --------------------------------------------------------------------------------------
def choices_for(schema: dict) -> list[tuple[str, str]]:
    """A choice schema's options as form choices; values travel as JSON so numbers and strings
    come back as they were."""
    return [(json.dumps(value), label) for value, label in choice_options(schema)]


def property_field(prop: dict, *, required: bool, label: str) -> forms.Field:
    """A form field for one scalar (or list-of-choices) property of a flat object schema."""
    # Django draws help text as HTML (`|safe` in its form templates); a schema's description is
    # text from a job or a kind, so it is escaped here.
    common: dict[str, Any] = {"required": required, "label": label, "help_text": escape(prop.get("description", ""))}
    kind = prop.get("type")
    if kind == "array":
        return forms.MultipleChoiceField(choices=choices_for(prop.get("items") or {}),
                                         widget=forms.CheckboxSelectMultiple, **common)
    if choice_options(prop):
        blank = [] if required else [("", "—")]
        return forms.ChoiceField(choices=blank + choices_for(prop), **common)
    if kind == "integer":
        return forms.IntegerField(min_value=prop.get("minimum"), max_value=prop.get("maximum"), **common)
    if kind == "number":
        return forms.FloatField(min_value=prop.get("minimum"), max_value=prop.get("maximum"), **common)
    if kind == "boolean":
        return forms.BooleanField(**{**common, "required": False})  # a checkbox: always true or false
    if prop.get("format") == "date":
        return forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), **common)
    if prop.get("format") == "email":
        return forms.EmailField(**common)
    long = (prop.get("maxLength") or 10_000) > 200
    return forms.CharField(max_length=prop.get("maxLength"), min_length=prop.get("minLength"),
                           widget=forms.Textarea(attrs=TEXTAREA) if long else forms.TextInput(attrs={"size": 40}),
                           **common)


def property_label(name: str, prop: dict) -> str:
    return prop.get("title") or capfirst(name.replace("_", " "))


class Omit:
    """A field left empty: the schema's `required` decides whether that is allowed."""


OMIT = Omit()


def property_value(prop: dict, value: Any) -> Any:
    """The JSON value of one property from its field's cleaned value, or OMIT."""
    if prop.get("type") == "boolean":
        return bool(value)
    if value in (None, "", []):
        return OMIT
    if prop.get("type") == "array":
        return [json.loads(item) for item in value]
    if choice_options(prop):
        return json.loads(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


# -- a job's input -------------------------------------------------------------------------------
def _resolved(prop: Any, defs: dict) -> Any:
    """A property as the fields read it: a local `$ref` (`#/$defs/Name`, as pydantic writes an
    enum) followed, and an optional value (`anyOf: [X, {"type": "null"}]`) read as X."""
    if not isinstance(prop, dict):
        return prop
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[len("#/$defs/"):] in defs:
        prop = {**defs[ref[len("#/$defs/"):]], **{k: v for k, v in prop.items() if k != "$ref"}}
    options = prop.get("anyOf")
    if isinstance(options, list):
        real = [option for option in options if not (isinstance(option, dict) and option.get("type") == "null")]
        if len(real) == 1 and len(options) == 2:
            rest = {k: v for k, v in prop.items() if k != "anyOf"}
            prop = {**_resolved(real[0], defs), **rest}
    return prop


def _is_text_list(prop: dict) -> bool:
    items = prop.get("items")
    return prop.get("type") == "array" and isinstance(items, dict) and items.get("type") == "string" \
        and not choice_options(items)


def input_fields_fit(schema: dict) -> bool:
    """Can the kind's input be asked for with fields? An object whose properties are scalars,
    choices, or lists of texts (one per line); no properties at all is an empty form."""
    if schema.get("type") != "object":
        return False
    if "properties" not in schema and schema.get("additionalProperties") is False:
        return True  # takes nothing: a form without fields
    if not isinstance(schema.get("properties"), dict):
        return False
    defs = schema.get("$defs") or {}
    for prop in schema["properties"].values():
        prop = _resolved(prop, defs)
        if not isinstance(prop, dict):
            return False
        if prop.get("type") in FLAT_TYPES or (choice_options(prop) and "type" not in prop):
            continue
        if prop.get("type") == "array" and (choice_options(prop.get("items") or {}) or _is_text_list(prop)):
            continue
        return False
    return True


def _initial(prop: dict, default: Any) -> Any:
    """A schema's `default` as its field's initial value (choices travel as JSON)."""
    if _is_text_list(prop):
        return "\n".join(str(item) for item in default) if isinstance(default, list) else ""
    if prop.get("type") == "array":
        return [json.dumps(item) for item in default] if isinstance(default, list) else []
    if choice_options(prop):
        return json.dumps(default)
    return default


class JobInputForm(forms.Form):
    """The input of a job of `kind`: a field per property of its input schema (a typed kind's
    model gives the same schema), or one JSON text area when the schema nests deeper.

    `value()` is the input's JSON; `add_input_error(exc)` puts an error of `job_submit`
    (`InvalidInput`, whose `field` is `input` or `input.<name>...`) next to the field it names.
    """

    JSON_FIELD = "input_json"
    required_css_class = "required"

    def __init__(self, kind: JobKind, data: Any = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.kind = kind
        schema = kind.input_schema
        self.properties: list[tuple[str, str, dict]] = []
        self.as_json = not input_fields_fit(schema)
        if self.as_json:
            self.fields[self.JSON_FIELD] = forms.CharField(
                label="Input (JSON)", initial="{}",
                help_text="The job's input as a JSON object; it is checked against the kind's input schema.",
                widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "class": "json-input", "spellcheck": "false"}),
            )
            return
        required = set(schema.get("required") or [])
        defs = schema.get("$defs") or {}
        for name, raw in ordered_properties(schema):
            prop = _resolved(raw, defs)
            field_name = f"in_{name}"
            label = property_label(name, prop)
            if _is_text_list(prop):
                field: forms.Field = forms.CharField(
                    label=label, required=name in required and prop.get("minItems", 0) > 0,
                    help_text=escape(prop.get("description") or "") + " One per line.",
                    widget=forms.Textarea(attrs=TEXTAREA))
            else:
                field = property_field(prop, required=name in required, label=label)
                if isinstance(field.widget, forms.Textarea) and not prop.get("maxLength"):
                    line = forms.TextInput()  # an input of unknown length: one line to start with
                    line.attrs.update(field.widget_attrs(line))
                    field.widget = line
            if prop.get("default") is not None:
                field.initial = _initial(prop, prop["default"])
            self.properties.append((field_name, name, prop))
            self.fields[field_name] = field

    def clean_input_json(self) -> Any:
        try:
            value = json_parse(self.cleaned_data[self.JSON_FIELD] or "{}")
        except ValueError as exc:  # not JSON, or nested too deep (JsonTooDeep)
            raise forms.ValidationError(f"not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("the input must be a JSON object, {...}")
        return value

    def value(self) -> dict[str, Any]:
        """The input's JSON from the cleaned fields."""
        if self.as_json:
            return self.cleaned_data[self.JSON_FIELD]
        result: dict[str, Any] = {}
        for field_name, name, prop in self.properties:
            raw = self.cleaned_data.get(field_name)
            if _is_text_list(prop):
                lines = [line.strip() for line in (raw or "").splitlines() if line.strip()]
                if lines or name in (self.kind.input_schema.get("required") or []):
                    result[name] = lines
                continue
            value = property_value(prop, raw)
            if value is not OMIT:
                result[name] = value
        return result

    def field_for(self, path: str) -> str | None:
        """The field that holds `path` (`input`, `input.seconds`, `input.documents.2`), if one does."""
        if self.as_json:
            return self.JSON_FIELD
        parts = path.split(".")
        name = parts[1] if len(parts) > 1 else ""
        return next((field_name for field_name, prop_name, _ in self.properties if prop_name == name), None)

    def add_input_error(self, error: PlatformError) -> None:
        path = error.field or ""
        name = self.field_for(path) if path else None
        prefix = f"{path}: "
        message = error.message[len(prefix):] if name and error.message.startswith(prefix) else error.message
        self.add_error(name, message)
