"""The decision ledger in the admin: read-only everywhere, exportable as CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from approvals.models import Decision

CSV_COLUMNS = [
    "created_at", "job", "job_kind", "question", "question_key", "round", "kind", "actor", "channel", "answer",
    "comment", "client_address", "digest", "detail",
]


# A cell starting with one of these runs as a formula when the file is opened in a spreadsheet
# (CSV injection): `=HYPERLINK(...)` in a comment would be a link in an auditor's Excel.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell that a spreadsheet shows as text: a leading quote before a formula
    character (OWASP's advice); other values unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def decisions_csv(decisions: Iterable[Decision], *, filename: str) -> HttpResponse:
    """The ledger rows as a CSV download (UTF-8, one row per decision, oldest first)."""
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for decision in decisions:
        writer.writerow([csv_cell(cell) for cell in (
            decision.created_at.isoformat(), decision.job_id, decision.job.kind, decision.question_id,
            decision.question.key, decision.round, decision.kind, decision.actor_name, decision.channel,
            "" if decision.answer is None else json.dumps(decision.answer, sort_keys=True), decision.comment,
            decision.client_address or "", decision.digest, json.dumps(decision.detail, sort_keys=True),
        )])
    return response


def csv_filename() -> str:
    """`decisions-<UTC time>.csv`."""
    return f"decisions-{timezone.now():%Y%m%dT%H%M%SZ}.csv"


class ReadOnlyLedgerMixin:
    """Nobody adds, changes or deletes ledger rows in the admin (not even superusers)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _answer_text(decision: Decision) -> str:
    return "—" if decision.answer is None else json.dumps(decision.answer, sort_keys=True)


class JobDecisionInline(ReadOnlyLedgerMixin, admin.TabularInline):
    """The ledger of a job's questions, on the job's admin page."""

    model = Decision
    fk_name = "job"
    verbose_name = "decision"
    verbose_name_plural = "decisions on its questions (append-only ledger)"
    fields = ("created_at", "question_key", "round", "kind", "actor_name", "channel", "answer_shown", "comment",
              "client_address", "digest_short")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("created_at", "id")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Decision]:
        return super().get_queryset(request).select_related("question")

    @admin.display(description="question")
    def question_key(self, decision: Decision) -> str:
        url = reverse("admin:approvals_question_change", args=[decision.question_id])
        return format_html('<a href="{}">{}</a>', url, decision.question.key)

    @admin.display(description="answer")
    def answer_shown(self, decision: Decision) -> str:
        return _answer_text(decision)

    @admin.display(description="digest shown")
    def digest_short(self, decision: Decision) -> str:
        return format_html('<code title="{}">{}…</code>', decision.digest, decision.digest[:12])


@admin.register(Decision)
class DecisionAdmin(ReadOnlyLedgerMixin, admin.ModelAdmin):
    """Every decision on every question, newest first; select rows and export them as CSV."""

    list_display = ("created_at", "kind", "actor_name", "channel", "question_link", "job_kind", "answer_shown",
                    "client_address")
    list_filter = ("kind", "channel", "job__kind")
    search_fields = ("actor_name", "question__key", "=job__id", "=question__id")
    list_select_related = ("question", "job")
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")
    actions = ("export_csv",)
    fields = ("created_at", "job", "question", "round", "kind", "actor", "actor_name", "channel", "answer_shown",
              "comment", "client_address", "digest", "detail")
    readonly_fields = fields

    @admin.display(description="question")
    def question_link(self, decision: Decision) -> str:
        url = reverse("admin:approvals_question_change", args=[decision.question_id])
        return format_html('<a href="{}">{}</a>', url, decision.question.key)

    @admin.display(description="kind", ordering="job__kind")
    def job_kind(self, decision: Decision) -> str:
        return decision.job.kind

    @admin.display(description="answer")
    def answer_shown(self, decision: Decision) -> str:
        return _answer_text(decision)

    @admin.action(description="Export the selected decisions as CSV", permissions=["view"])
    def export_csv(self, request: HttpRequest, queryset: QuerySet[Decision]) -> HttpResponse:
        rows = queryset.select_related("job", "question").order_by("created_at", "id")
        return decisions_csv(rows, filename=csv_filename())
