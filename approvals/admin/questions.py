"""The reviewers' inbox: it opens on the questions waiting for the reviewer, soonest deadline
first; each question's page shows its details above a form made for its type, then its ledger.

Every answer (the question page's form and the bulk approve / reject actions) goes through
`approvals.services.question_answer`, the same service and permission check as the API.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import Case, F, IntegerField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from approvals.admin.decisions import csv_filename, decisions_csv
from approvals.admin.filters import AssigneeFilter, DeadlineFilter, InboxFilter
from approvals.forms import answer_form_for
from approvals.models import ASKED_AGAIN_REASONS, Decision, Question
from approvals.policies import policy_describe
from approvals.rendering import answered_message, details_html
from approvals.schemas import REASON_MAX_LENGTH, QuestionType, schema_summary
from approvals.selectors import ANSWER_PERMISSION, question_decisions
from approvals.services import NotAllowedToAnswer, question_answer, question_check_can_answer, question_link
from approvals.services.ledger import request_client_address
from jobs.errors import PlatformError
from jobs.presenters import duration_short, json_block
from jobs.presenters import time_left as time_left_text

PROMPT_SHORT = 60  # characters of a prompt in the inbox; the whole prompt shows on hover


class QuestionActionForm(ActionForm):
    """The action bar, with the reason that bulk reject records (and bulk approve, if given)."""

    reason = forms.CharField(required=False, label="Reason", max_length=REASON_MAX_LENGTH,
                             widget=forms.TextInput(attrs={"size": 30}))


@admin.register(Question)
class QuestionAdmin(admin.ModelAdmin):
    # Chosen for a 1,280 px screen beside the filters: the prompt (short; the whole on hover),
    # its job, where it stands, and the time left. Below about 800 px the rows become a list
    # (approvals/admin.css).
    list_display = ("prompt_short", "job_link", "status_label", "time_left", "age")
    list_filter = (InboxFilter, "status", "job__kind", AssigneeFilter, DeadlineFilter)
    search_fields = ("prompt", "key", "=job__id")
    list_select_related = ("job", "job__parent", "answered_by")
    action_form = QuestionActionForm
    actions = ("approve_selected", "reject_selected", "export_decisions_csv")
    # The page leads with the decision (admin/approvals/question/_decision.html: the prompt, the
    # details, what is asked and of whom, the answer form or the answer, then the ledger); the
    # technical fields follow, collapsed.
    fieldsets = (
        ("Technical", {"classes": ("collapse",), "fields": (
            "id", "key", "status", "deep_link", "assignees", "schema_display", "digest", "round", "opened_at",
            "created_at")}),
    )
    readonly_fields = (
        "id", "key", "status", "deep_link", "assignees", "schema_display", "digest", "round", "opened_at",
        "created_at", "asked_again",
    )
    change_form_template = "admin/approvals/question/change_form.html"

    class Media:
        css = {"all": ("approvals/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Question]:
        return super().get_queryset(request).prefetch_related("assigned_users", "assigned_groups")

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        # Open questions first, then the soonest deadline (none last), then the oldest.
        open_first = Case(When(status=Question.Status.OPEN, then=Value(0)), default=Value(1),
                          output_field=IntegerField())
        return [open_first, F("expires_at").asc(nulls_last=True), "created_at"]

    # -- columns and fields ------------------------------------------------------------------
    @admin.display(description="question")
    def prompt_short(self, question: Question) -> str:
        prompt = " ".join(question.prompt.split())
        short = prompt if len(prompt) <= PROMPT_SHORT else prompt[: PROMPT_SHORT - 1].rstrip() + "…"
        if question.asked_again_because:
            why = ASKED_AGAIN_REASONS.get(question.asked_again_because, question.asked_again_because)
            return format_html('<span class="prompt" title="{}">{}</span><br><span class="asked-again">asked again '
                               "(round {}), because {}</span>", prompt, short, question.round, why)
        return format_html('<span class="prompt" title="{}">{}</span>', prompt, short)

    @admin.display(description="round")
    def asked_again(self, question: Question) -> str:
        return question.asked_again_text()

    @admin.display(description="job")
    def job_link(self, question: Question) -> str:
        url = reverse("admin:jobs_job_change", args=[question.job_id])
        link = format_html('<a href="{}">{} <code>{}</code></a>', url, question.job.kind, str(question.job_id)[:8])
        parent = question.job.parent
        if parent is None:
            return link
        # A child job's question (ctx.spawn): the job it is part of.
        parent_url = reverse("admin:jobs_job_change", args=[parent.pk])
        return format_html('{} <span class="parent-job">in <a href="{}">{} {}</a></span>', link, parent_url,
                           parent.kind, str(parent.pk)[:8])

    @admin.display(description="status", ordering="status")
    def status_label(self, question: Question) -> str:
        if question.status == Question.Status.OPEN and question.required_approvals > 1:
            return f"open · {question.approvals_so_far()} of {question.required_approvals} approvals"
        if question.status == Question.Status.ANSWERED and question.answered_by is not None:
            return f"answered by {question.answered_by.get_username()}"
        return question.get_status_display().lower()

    @admin.display(description="asks for")
    def asks(self, question: Question) -> str:
        return schema_summary(question.schema)

    @admin.display(description="assignees")
    def assignees(self, question: Question) -> str:
        users = sorted(user.get_username() for user in question.assigned_users.all())
        groups = sorted(f"group:{group.name}" for group in question.assigned_groups.all())
        return ", ".join(users + groups) or "— (superusers only)"

    @admin.display(description="approvals")
    def approvals(self, question: Question) -> str:
        if question.required_approvals <= 1:
            return "—"
        return f"{question.approvals_so_far()} of {question.required_approvals}"

    @admin.display(description="age", ordering="opened_at")
    def age(self, question: Question) -> str:
        return duration_short((timezone.now() - question.opened_at).total_seconds())

    @admin.display(description="time left", ordering="expires_at")
    def time_left(self, question: Question) -> str:
        if question.expires_at is None or question.status != Question.Status.OPEN:
            return "—"
        left = time_left_text(question.expires_at)
        if question.expires_at <= timezone.now():
            return format_html('<strong class="overdue">{}</strong>', left)
        return left

    @admin.display(description="deadline")
    def deadline(self, question: Question) -> str:
        if question.expires_at is None:
            return "none"
        when = f"{question.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        if question.status != Question.Status.OPEN:
            return when
        return f"{when} ({time_left_text(question.expires_at)}); then {policy_describe(question.on_timeout)}"

    @admin.display(description="link to this question")
    def deep_link(self, question: Question) -> str:
        link = question_link(question)
        return format_html('<a href="{}">{}</a>', link, link)

    @admin.display(description="answer schema")
    def schema_display(self, question: Question) -> str:
        return json_block(question.schema)

    # -- permissions -------------------------------------------------------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # questions are asked by jobs

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # answered through the answer form, never edited

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_answer_permission(self, request: HttpRequest) -> bool:
        """The bulk answer actions show for holders of the answer permission; each question is
        still checked on its own by the service."""
        return request.user.has_perm(ANSWER_PERMISSION)

    # -- the question page and its answer form -------------------------------------------------
    def get_urls(self) -> list[Any]:
        custom = [
            path("<path:object_id>/answer/", self.admin_site.admin_view(self.answer_view),
                 name="approvals_question_answer"),
        ]
        return custom + super().get_urls()

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        question = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if question is not None:
            extra["decision"] = self.decision_context(question)
            extra["decisions"] = [
                (decision, None if decision.answer is None else json.dumps(decision.answer, sort_keys=True))
                for decision in question_decisions(question)
            ]
            if question.status == Question.Status.OPEN:
                try:
                    question_check_can_answer(question=question, user=request.user)
                except NotAllowedToAnswer as exc:
                    extra["not_allowed"] = exc.message
                else:
                    extra["answer_form"] = answer_form_for(question)
                    extra["answer_url"] = reverse("admin:approvals_question_answer", args=[question.pk])
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def decision_context(self, question: Question) -> dict[str, Any]:
        """What the page leads with: the prompt, the details, what kind of answer, of whom, by
        when, the votes so far, and the answer once there is one."""
        return {
            "prompt": question.prompt,
            "status": question.status,
            "details_html": details_html(question.details),
            "asks": schema_summary(question.schema),
            "job_link": self.job_link(question),
            "assignees": self.assignees(question),
            "approvals": self.approvals(question),
            "deadline": self.deadline(question),
            "overdue": question.status == Question.Status.OPEN and question.expires_at is not None
            and question.expires_at <= timezone.now(),
            "answer_html": details_html(question.answer) if question.answer is not None else "",
            "answered_by": question.answered_by.get_username() if question.answered_by else "",
            "answered_at": question.answered_at,
            "comment": question.comment,
            "asked_again": question.asked_again_text() if question.asked_again_because else "",
        }

    def answer_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        question = get_object_or_404(self.get_queryset(request), pk=object_id)
        back = reverse("admin:approvals_question_change", args=[question.pk])
        form = answer_form_for(question, request.POST)
        if not form.is_valid():
            errors = "; ".join(f"{name}: {' '.join(errs)}" if name != "__all__" else " ".join(errs)
                               for name, errs in form.errors.items())
            self.message_user(request, f"The answer was not recorded: {errors}", messages.ERROR)
            return HttpResponseRedirect(back)
        try:
            question = question_answer(
                question_id=question.pk, user=request.user, answer=form.answer(), comment=form.comment(),
                channel=Decision.Channel.ADMIN, client_address=request_client_address(request), job_id=question.job_id,
            )
        except PlatformError as exc:
            self.message_user(request, f"The answer was not recorded: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(back)
        self.message_user(request, answered_message(question), messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:approvals_question_changelist"))

    # -- bulk actions --------------------------------------------------------------------------
    def _answer_each(self, request: HttpRequest, queryset: QuerySet[Question], *, approved: bool) -> None:
        reason = (request.POST.get("reason") or "").strip()
        answer: dict[str, Any] = {"approved": approved, **({"reason": reason} if reason else {})}
        done, voted, refused = 0, 0, []
        for question in queryset:
            try:
                if question.type != QuestionType.APPROVAL:
                    raise PlatformError("not an approve/reject question; open it to answer")
                answered = question_answer(
                    question_id=question.pk, user=request.user, answer=answer, comment=reason,
                    channel=Decision.Channel.ADMIN, client_address=request_client_address(request),
                    job_id=question.job_id,
                )
            except PlatformError as exc:
                refused.append(f"“{question.prompt[:40]}” ({str(question.pk)[:8]}): {exc.message}")
                continue
            if answered.status == Question.Status.OPEN:
                voted += 1
            else:
                done += 1
        verb = "Approved" if approved else "Rejected"
        if done:
            self.message_user(request, f"{verb} {done} question(s); their jobs resume.", messages.SUCCESS)
        if voted:
            self.message_user(request, f"Recorded your approval on {voted} question(s) that wait for more "
                              "reviewers.", messages.SUCCESS)
        if refused:
            self.message_user(request, f"Refused {len(refused)}: " + "; ".join(refused), messages.WARNING)

    @admin.action(description="Approve the selected questions", permissions=["answer"])
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[Question]) -> None:
        self._answer_each(request, queryset, approved=True)

    @admin.action(description="Reject the selected questions (give the reason)", permissions=["answer"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[Question]) -> None:
        self._answer_each(request, queryset, approved=False)

    @admin.action(description="Export the decisions on the selected questions as CSV", permissions=["view"])
    def export_decisions_csv(self, request: HttpRequest, queryset: QuerySet[Question]) -> HttpResponse:
        rows = (Decision.objects.filter(question__in=queryset.values("pk")).select_related("job", "question")
                .order_by("created_at", "id"))
        return decisions_csv(rows, filename=csv_filename())
