"""Waits in the admin: what a parked job waits for, and a person standing in for the service
(check now, cancel). Read-only; both actions go through `waits.services`."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.html import format_html

from jobs.admin_actions import admin_apply_each
from waits.models import Wait
from waits.services import wait_cancel, wait_check_now

SHOWN = ("service", "state", "external_id", "next_due_at", "deadline_at", "checks", "throttle_bounces",
         "transport_failures", "executions")


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
        "job_link", "key", "service", "mode", "state", "external_id", "policy", "token_used_at", "woken_at",
        "checks", "throttle_bounces", "transport_failures", "transport_failures_total", "executions",
        "accepted_at", "next_due_at", "deadline_at", "last_checked_at", "result", "error", "created_at",
        "updated_at",
    )
    fields = readonly_fields

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

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {**(extra_context or {}), "may_operate": self.has_operate_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context=extra)
