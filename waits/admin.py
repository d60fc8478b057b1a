"""Waits in the admin: what a parked job waits for, and a person standing in for the service
(check now, cancel; on a combined wait: provide the result, retry the submit, fail it), with the
wait's ledger. Read-only; every action goes through `waits.services` and `waits.people`."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from approvals.policies import policy_describe
from jobs.admin_actions import admin_apply_each
from waits.models import Wait, WaitDecision
from waits.pages import act_from_post, combined_wait_context
from waits.services import wait_cancel, wait_check_now

SHOWN = ("service", "state", "external_id", "next_due_at", "deadline_at", "checks", "throttle_bounces",
         "transport_failures", "executions", "ended_by")


class WaitDecisionInline(admin.TabularInline):
    """On the wait's page: its ledger (what ended it, through which channel; refused actions)."""

    model = WaitDecision
    fields = ("created_at", "kind", "channel", "via", "actor_name", "result", "comment", "client_address", "detail")
    readonly_fields = fields
    extra = 0
    can_delete = False
    verbose_name = "ledger row"
    verbose_name_plural = "Ledger (append-only)"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class WaitInline(admin.TabularInline):
    """On the job's page: what it waits for, with a link to the wait's own page and its actions."""

    model = Wait
    fields = ("wait_link", *SHOWN)
    readonly_fields = fields
    extra = 0
    can_delete = False

    @admin.display(description="wait")
    def wait_link(self, wait: Wait) -> str:
        return format_html('<a href="{}">{}</a>', reverse("admin:waits_wait_change", args=[wait.pk]), wait.key)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Wait)
class WaitAdmin(admin.ModelAdmin):
    list_display = ("key", "job_link", *SHOWN)
    list_filter = ("state", "service", "mode")
    search_fields = ("=job__id", "key", "external_id", "service")
    list_select_related = ("job",)
    actions = ("check_now", "cancel")
    change_form_template = "admin/waits/wait/change_form.html"
    exclude = ("token_salt", "token_hash")  # never shown: the salt and the secret key make the token
    readonly_fields = (
        "job_link", "key", "service", "mode", "state", "ended_by", "ended_at", "person_prompt", "assignees",
        "deadline_policy", "external_id", "policy", "token_used_at", "woken_at",
        "checks", "throttle_bounces", "transport_failures", "transport_failures_total", "executions",
        "accepted_at", "next_due_at", "deadline_at", "last_checked_at", "result", "error", "created_at",
        "updated_at",
    )
    fields = readonly_fields
    inlines = [WaitDecisionInline]

    @admin.display(description="a person may stand in")
    def person_prompt(self, wait: Wait) -> str:
        return wait.person.get("prompt", "") if wait.has_person else "no (only the service ends it)"

    @admin.display(description="who may act")
    def assignees(self, wait: Wait) -> str:
        return ", ".join(wait.assignee_names()) or "—" if wait.has_person else "—"

    @admin.display(description="at the deadline")
    def deadline_policy(self, wait: Wait) -> str:
        if not wait.has_person:
            return "fail the job (deadline_exceeded)"
        return policy_describe(wait.on_timeout) if wait.deadline_at else "no deadline"

    @admin.display(description="job", ordering="job")
    def job_link(self, wait: Wait) -> str:
        job = wait.job
        return format_html('<a href="{}">{} {}</a> ({})', reverse("admin:jobs_job_change", args=[job.pk]),
                           job.kind, str(job.pk)[:8], job.status)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request) -> bool:
        """Check now and cancel need Django's "change job" permission, like cancelling a job."""
        return request.user.has_perm("jobs.change_job")

    # -- actions ------------------------------------------------------------------------------
    def _apply(self, request: HttpRequest, waits, service, verb: str) -> None:
        admin_apply_each(
            self, request, waits, lambda wait: service(wait_id=wait.pk, actor=request.user), verb=verb, noun="wait"
        )

    @admin.action(description="Check selected waits now", permissions=["operate"])
    def check_now(self, request, queryset):
        self._apply(request, queryset, wait_check_now, "Checking")

    @admin.action(description="Cancel selected waits (and their jobs)", permissions=["operate"])
    def cancel(self, request, queryset):
        self._apply(request, queryset, wait_cancel, "Cancelled")

    # -- the same two as buttons on a wait's page ----------------------------------------------
    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<int:wait_id>/check-now/", view(self.check_now_view), name="waits_wait_check_now"),
            path("<int:wait_id>/cancel/", view(self.cancel_view), name="waits_wait_cancel"),
            path("<int:wait_id>/act/", view(self.act_view), name="waits_wait_act"),
            *super().get_urls(),
        ]

    def _button(self, request: HttpRequest, wait_id: int, service, verb: str) -> HttpResponseRedirect:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        wait = get_object_or_404(Wait, pk=wait_id)
        self._apply(request, [wait], service, verb)
        return HttpResponseRedirect(reverse("admin:waits_wait_change", args=[wait_id]))

    def check_now_view(self, request: HttpRequest, wait_id: int) -> HttpResponseRedirect:
        return self._button(request, wait_id, wait_check_now, "Checking")

    def cancel_view(self, request: HttpRequest, wait_id: int) -> HttpResponseRedirect:
        return self._button(request, wait_id, wait_cancel, "Cancelled")

    def act_view(self, request: HttpRequest, wait_id: int) -> HttpResponseRedirect:
        """A person's action on a combined wait (provide, retry the submit, fail), through
        `waits.people` like the job's page and the API (ledger `via` = `admin`)."""
        wait = get_object_or_404(Wait.objects.select_related("job"), pk=wait_id, person__isnull=False)
        if request.method != "POST":
            self.message_user(request, "Not allowed.", messages.ERROR)
        else:
            level, message, form = act_from_post(request, wait, via="admin")
            if form is not None and form.errors:
                message = f"{message} " + "; ".join(f"{name}: {' '.join(errs)}" for name, errs in form.errors.items())
            self.message_user(request, message, messages.SUCCESS if level == "success" else messages.ERROR)
        return HttpResponseRedirect(reverse("admin:waits_wait_change", args=[wait_id]))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {**(extra_context or {}), "may_operate": self.has_operate_permission(request)}
        wait = Wait.objects.select_related("job").filter(pk=object_id, person__isnull=False).first() \
            if str(object_id).isdigit() else None
        if wait is not None and wait.is_active:
            extra["combined"] = combined_wait_context(wait, request.user)
            extra["act_url"] = reverse("admin:waits_wait_act", args=[wait.pk])
        return super().change_view(request, object_id, form_url, extra_context=extra)
