"""The answer form for each question type, drawn by the admin and by the job page.

The forms only turn posted fields into the answer's JSON; the answer is then checked against
the question's schema by `approvals.services.question_answer`, as on every other path. JSON is
asked for only when the schema is nested beyond what fields can show.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from approvals.models import COMMENT_MAX_LENGTH, Question
from approvals.schemas import (
    REASON_MAX_LENGTH,
    QuestionType,
    is_flat_object,
    ordered_properties,
    question_type,
)
from jobs.errors import PlatformError
from jobs.forms import OMIT, TEXTAREA, choices_for, property_field, property_label, property_value
from jobs.json_input import json_parse


class AnswerForm(forms.Form):
    """Base of the answer forms: `answer()` is the JSON answer, `comment()` the free comment."""

    # (name, label, css class) of the submit buttons drawn under the form.
    buttons: list[tuple[str, str, str]] = [("_answer", "Send answer", "default")]

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        # kwargs go to Django's Form (`auto_id`, for pages that show several questions at once).
        super().__init__(data, **kwargs)
        self.question = question
        self.schema = question.schema

    def answer(self) -> Any:
        raise NotImplementedError

    def comment(self) -> str:
        return (self.cleaned_data.get("comment") or "").strip()

    def field_for(self, path: str) -> str | None:
        """The form field that holds `path` of the answer (`answer`, `answer.amount`, …), if one does."""
        return None

    def add_answer_error(self, error: PlatformError) -> None:
        """Show an error of `question_answer` next to the field it names (an `InvalidAnswer`'s
        `field` is `answer` or `answer.<path>`), or above the form when no field holds it."""
        path = error.field or ""
        name = self.field_for(path) if path else None
        prefix = f"{path}: "
        message = error.message[len(prefix):] if name and error.message.startswith(prefix) else error.message
        self.add_error(name, message)


def _comment_field() -> forms.CharField:
    return forms.CharField(required=False, label="Comment (optional)", max_length=COMMENT_MAX_LENGTH,
                           widget=forms.Textarea(attrs=TEXTAREA))


def _choices(schema: dict) -> list[tuple[str, str]]:
    # Values travel as JSON so numbers and strings come back as they were.
    return choices_for(schema)


class ApprovalAnswerForm(AnswerForm):
    """Approve or reject, with a reason (required to reject when the schema says so)."""

    buttons = [("_approve", "Approve", "default"), ("_reject", "Reject", "")]
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs=TEXTAREA))

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        super().__init__(question, data, **kwargs)
        self.reason_required = "then" in self.schema
        reason = (self.schema.get("properties") or {}).get("reason") or {}
        self.fields["reason"] = forms.CharField(
            required=False, widget=forms.Textarea(attrs=TEXTAREA),
            max_length=reason.get("maxLength", REASON_MAX_LENGTH),
            label="Reason (required to reject)" if self.reason_required else "Reason (optional)",
        )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "_approve" not in self.data and "_reject" not in self.data:
            raise forms.ValidationError("press Approve or Reject")
        if "_reject" in self.data and self.reason_required and not (cleaned.get("reason") or "").strip():
            self.add_error("reason", "give a reason to reject")
        return cleaned

    def answer(self) -> dict[str, Any]:
        result: dict[str, Any] = {"approved": "_approve" in self.data}
        reason = (self.cleaned_data.get("reason") or "").strip()
        if reason:
            result["reason"] = reason
        return result

    def comment(self) -> str:
        return (self.cleaned_data.get("reason") or "").strip()

    def field_for(self, path: str) -> str | None:
        return "reason" if path == "answer.reason" else None


class ChoiceAnswerForm(AnswerForm):
    """Exactly one option, as radio buttons."""

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        super().__init__(question, data, **kwargs)
        self.fields["choice"] = forms.ChoiceField(choices=_choices(self.schema), widget=forms.RadioSelect,
                                                  label="Your choice")
        self.fields["comment"] = _comment_field()

    def answer(self) -> Any:
        return json.loads(self.cleaned_data["choice"])

    def field_for(self, path: str) -> str | None:
        return "choice"


class MultipleChoiceAnswerForm(AnswerForm):
    """Some options, as checkboxes; how many is checked by the schema (minItems, maxItems)."""

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        super().__init__(question, data, **kwargs)
        low, high = self.schema.get("minItems", 0), self.schema.get("maxItems")
        hint = f"choose at least {low}" + (f" and at most {high}" if high is not None else "")
        self.fields["choices"] = forms.MultipleChoiceField(
            choices=_choices(self.schema.get("items") or {}), widget=forms.CheckboxSelectMultiple,
            required=low > 0, label="Your choices", help_text=hint,
        )
        self.fields["comment"] = _comment_field()

    def answer(self) -> list[Any]:
        return [json.loads(value) for value in self.cleaned_data.get("choices") or []]

    def field_for(self, path: str) -> str | None:
        return "choices"


class TextAnswerForm(AnswerForm):
    """A free text, at most `maxLength` characters."""

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        super().__init__(question, data, **kwargs)
        self.fields["text"] = forms.CharField(
            label="Your answer", widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), strip=False,
            max_length=self.schema.get("maxLength"), required=self.schema.get("minLength", 0) > 0,
        )
        self.fields["comment"] = _comment_field()

    def answer(self) -> str:
        return self.cleaned_data.get("text") or ""

    def field_for(self, path: str) -> str | None:
        return "text"


class FlatFormAnswerForm(AnswerForm):
    """An object whose properties are scalars: one field each (text, number, checkbox, select)."""

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        super().__init__(question, data, **kwargs)
        required = set(self.schema.get("required") or [])
        self.properties: list[tuple[str, str, dict]] = []
        for name, prop in ordered_properties(self.schema):
            field_name = f"p_{name}"
            self.properties.append((field_name, name, prop))
            self.fields[field_name] = property_field(prop, required=name in required, label=property_label(name, prop))
        self.fields["comment"] = _comment_field()

    def answer(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for field_name, name, prop in self.properties:
            value = property_value(prop, self.cleaned_data.get(field_name))
            if value is not OMIT:  # not given: the schema's `required` decides whether that is allowed
                result[name] = value
        return result

    def field_for(self, path: str) -> str | None:
        name = path.split(".")[1] if "." in path else ""
        return next((field_name for field_name, prop_name, _ in self.properties if prop_name == name), None)


class JsonAnswerForm(AnswerForm):
    """A nested schema: the answer as JSON, checked against the schema by the service."""

    def __init__(self, question: Question, data: Any = None, **kwargs: Any) -> None:
        super().__init__(question, data, **kwargs)
        self.fields["answer_json"] = forms.CharField(
            label="Answer (JSON)", help_text="A JSON value matching the answer schema shown above.",
            widget=forms.Textarea(attrs={"rows": 8, "cols": 60, "class": "json-input"}),
        )
        self.fields["comment"] = _comment_field()

    def clean_answer_json(self) -> Any:
        try:
            return json_parse(self.cleaned_data["answer_json"])
        except ValueError as exc:  # not JSON, or nested too deep
            raise forms.ValidationError(f"not valid JSON: {exc}") from exc

    def answer(self) -> Any:
        return self.cleaned_data["answer_json"]

    def field_for(self, path: str) -> str | None:
        return "answer_json"


def answer_form_for(question: Question, data: Any = None, **kwargs: Any) -> AnswerForm:
    """The form that fits the question's type (JSON only for nested schemas); `kwargs` go to
    Django's Form (`auto_id`)."""
    kind = question_type(question.schema)
    form_class: type[AnswerForm] = {
        QuestionType.APPROVAL: ApprovalAnswerForm,
        QuestionType.CHOICE: ChoiceAnswerForm,
        QuestionType.MULTIPLE_CHOICE: MultipleChoiceAnswerForm,
        QuestionType.TEXT: TextAnswerForm,
    }.get(kind, JsonAnswerForm)
    if kind == QuestionType.FORM and is_flat_object(question.schema):
        form_class = FlatFormAnswerForm
    return form_class(question, data, **kwargs)
