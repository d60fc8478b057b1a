"""A question's details for people: a definition list, tables for lists of records, plain text
for e-mails. Never raw JSON, except past a depth where structure stops helping."""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

MAX_DEPTH = 4


def _scalar(value: Any) -> str:
    if value is None:
        return "—"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def _is_records(value: Any) -> bool:
    """A non-empty list of flat dicts: shown as a table."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(row, dict) and all(not isinstance(v, dict | list) for v in row.values()) for row in value)
    )


def details_html(value: Any, depth: int = 0) -> SafeString:
    """`value` (any JSON) as HTML: dicts as <dl>, lists of records as <table>, lists as <ul>."""
    if depth > MAX_DEPTH:
        return format_html("<code>{}</code>", json.dumps(value, sort_keys=True))
    if isinstance(value, dict):
        if not value:
            return mark_safe("—")
        rows = format_html_join(
            "", "<dt>{}</dt><dd>{}</dd>", ((key, details_html(item, depth + 1)) for key, item in value.items())
        )
        return format_html('<dl class="question-details">{}</dl>', rows)
    if _is_records(value):
        columns: list[str] = []
        for row in value:
            columns += [key for key in row if key not in columns]
        head = format_html_join("", "<th>{}</th>", ((column,) for column in columns))
        body = format_html_join(
            "",
            "<tr>{}</tr>",
            ((format_html_join("", "<td>{}</td>", ((_scalar(row.get(c)),) for c in columns)),) for row in value),
        )
        return format_html('<table class="question-details"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>',
                           head, body)
    if isinstance(value, list):
        if not value:
            return mark_safe("—")
        items = format_html_join("", "<li>{}</li>", ((details_html(item, depth + 1),) for item in value))
        return format_html("<ul>{}</ul>", items)
    if isinstance(value, str) and "\n" in value:
        return format_html('<div class="pre-wrap">{}</div>', value)
    return mark_safe(escape(_scalar(value)))


def details_text(value: Any, indent: int = 0) -> str:
    """`value` (any JSON) as indented `key: value` lines, for e-mails."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:")
                lines.append(details_text(item, indent + 1))
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        return "\n".join(
            f"{pad}- {json.dumps(item, sort_keys=True) if isinstance(item, dict | list) else _scalar(item)}"
            for item in value
        )
    return f"{pad}{_scalar(value)}"


def answered_message(question: Any) -> str:
    """What a reviewer is told after answering (the admin and the job page say the same)."""
    if question.status == "open":  # a vote towards a quorum
        return (f"Your approval is recorded ({question.approvals_so_far()} of {question.required_approvals}); "
                "the question waits for another reviewer.")
    return f"Answer recorded; job {str(question.job_id)[:8]} resumes."
