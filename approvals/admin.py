"""The reviewers' inbox: open questions first; each question page has its answer form.

Answering posts to `<question>/answer/`, which calls `approvals.services.question_answer`, the
same service (and the same permission check) as the API.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.db.models import Case, IntegerField, Value, When
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from approvals.models import Question
from approvals.schemas import is_approval
from approvals.services import question_answer
from jobs.errors import PlatformError


class ApprovalAnswerForm(forms.Form):
    """Approve or reject, with a reason."""

    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))

    def answer(self, data) -> dict:
        approved = "_approve" in data
        result: dict = {"approved": approved}
        if self.cleaned_data.get("reason"):
            result["reason"] = self.cleaned_data["reason"]
        return result


class JsonAnswerForm(forms.Form):
    """Any other schema: the answer as JSON, checked against the schema by the service."""

    answer_json = forms.CharField(
        label="Answer (JSON)", widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "style": "font-family: monospace"})
    )
    comment = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))

    def clean_answer_json(self):
        try:
            return json.loads(self.cleaned_data["answer_json"])
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc}") from exc

    def answer(self, data):
        return self.cleaned_data["answer_json"]


def answer_form_for(question: Question, data=None) -> forms.Form:
    return (ApprovalAnswerForm if is_approval(question.schema) else JsonAnswerForm)(data)


@admin.register(Question)
class QuestionAdmin(admin.ModelAdmin):
    list_display = ("prompt_short", "job_link", "job_kind", "status", "created_at", "answered_by", "answered_at")
    list_filter = ("status", "job__kind")
    search_fields = ("prompt", "key", "=job__id")
    list_select_related = ("job", "answered_by")
    readonly_fields = (
        "id", "job_link", "key", "prompt", "details_display", "schema_display", "status", "answer_display",
        "comment", "answered_by", "answered_at", "expires_at", "created_at",
    )
    fields = readonly_fields
    change_form_template = "admin/approvals/question/change_form.html"

    def get_ordering(self, request):
        # Open questions first, newest first within each status.
        return [Case(When(status=Question.Status.OPEN, then=Value(0)), default=Value(1), output_field=IntegerField()),
                "-created_at"]

    @admin.display(description="question")
    def prompt_short(self, question: Question) -> str:
        return question.prompt[:80]

    @admin.display(description="job")
    def job_link(self, question: Question) -> str:
        url = reverse("admin:jobs_job_change", args=[question.job_id])
        return format_html('<a href="{}">{} {}</a>', url, question.job.kind, str(question.job_id)[:8])

    @admin.display(description="kind", ordering="job__kind")
    def job_kind(self, question: Question) -> str:
        return question.job.kind

    @staticmethod
    def _json(value) -> str:
        return format_html("<pre style='margin:0'>{}</pre>", json.dumps(value, indent=2, sort_keys=True))

    @admin.display(description="details")
    def details_display(self, question: Question) -> str:
        return self._json(question.details)

    @admin.display(description="answer schema")
    def schema_display(self, question: Question) -> str:
        return self._json(question.schema)

    @admin.display(description="answer")
    def answer_display(self, question: Question) -> str:
        return self._json(question.answer) if question.answer is not None else "—"

    def has_add_permission(self, request):
        return False  # questions are asked by jobs

    def has_change_permission(self, request, obj=None):
        return False  # answered through the answer form, never edited

    def has_delete_permission(self, request, obj=None):
        return False

    # -- answering --------------------------------------------------------------------------
    def get_urls(self):
        custom = [
            path("<path:object_id>/answer/", self.admin_site.admin_view(self.answer_view),
                 name="approvals_question_answer"),
        ]
        return custom + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        question = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if question is not None and question.status == Question.Status.OPEN:
            extra["answer_form"] = answer_form_for(question)
            extra["is_approval"] = is_approval(question.schema)
            extra["answer_url"] = reverse("admin:approvals_question_answer", args=[question.pk])
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def answer_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        question = get_object_or_404(Question, pk=object_id)
        back = reverse("admin:approvals_question_change", args=[question.pk])
        form = answer_form_for(question, request.POST)
        if not form.is_valid():
            errors = "; ".join(f"{name}: {' '.join(errs)}" for name, errs in form.errors.items())
            self.message_user(request, f"The answer was not recorded: {errors}", messages.ERROR)
            return HttpResponseRedirect(back)
        try:
            question_answer(
                question_id=question.pk,
                user=request.user,
                answer=form.answer(request.POST),
                comment=form.cleaned_data.get("comment") or form.cleaned_data.get("reason") or "",
                channel="admin",
            )
        except PlatformError as exc:
            self.message_user(request, f"The answer was not recorded: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(back)
        self.message_user(request, f"Answer recorded; job {str(question.job_id)[:8]} resumes.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:approvals_question_changelist"))
