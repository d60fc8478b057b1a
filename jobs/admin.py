"""The jobs in the admin: submit a job, watch it, cancel or retry it. Status is read-only here;
every change goes through `jobs.services`."""

from __future__ import annotations

from functools import partial

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.forms.models import _get_foreign_key
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from jobs.admin_actions import admin_apply_each
from jobs.errors import PlatformError
from jobs.extensions import job_admin_inlines, job_admin_links
from jobs.json_input import json_parse
from jobs.models import Job
from jobs.presenters import json_block, time_with_age
from jobs.registry import kinds_all
from jobs.selectors import job_children_counts
from jobs.services import job_cancel, job_retry, job_submit


class JobSubmitForm(forms.Form):
    kind = forms.ChoiceField()
    input = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 80, "class": "json-input"}),
        initial="{}",
        help_text="The job's input as JSON; it is checked against the kind's input schema.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = [(k.name, f"{k.name} — {k.description}") for k in kinds_all()]

    def clean_input(self):
        try:
            return json_parse(self.cleaned_data["input"] or "{}")
        except ValueError as exc:  # not JSON, or nested too deep
            raise forms.ValidationError(f"not valid JSON: {exc}") from exc


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("short_id", "kind", "status", "progress_percent", "attempts", "owner", "created_at")
    list_filter = ("status", "kind")
    search_fields = ("=id", "kind", "idempotency_key")
    date_hierarchy = "created_at"
    list_select_related = ("owner",)
    actions = ("cancel_jobs", "retry_jobs")
    # The page reads at a glance: the live box first (status, progress, result or error, the open
    # questions, and the one timeline: the newest events, earlier ones on request), then the
    # facts, then what the feature apps register (jobs.extensions.job_admin_inline: the decision
    # ledger, what it waits for), each only when it has rows.
    inlines = ()
    # The live box is the same as on /jobs/{id}/ (jobs/_live.html and live.js).
    change_form_template = "admin/jobs/job/change_form.html"
    fieldsets = (
        (None, {"fields": ("id", "kind", "owner", "attempts_display", "family", "links")}),
        ("Data", {"fields": ("input_display", "error_display", "checkpoint_display")}),
        ("Times (UTC)", {"fields": ("created_display", "updated_display", "started_display", "finished_display",
                                    "run_after_display")}),
    )
    readonly_fields = (
        "id", "kind", "owner", "attempts_display", "input_display", "error_display", "checkpoint_display",
        "created_display",
        "updated_display", "started_display", "finished_display", "run_after_display", "links", "family",
    )

    # -- list columns --------------------------------------------------------------------------
    @admin.display(description="job", ordering="id")
    def short_id(self, job: Job) -> str:
        return str(job.pk)[:8]

    @admin.display(description="progress", ordering="progress_fraction")
    def progress_percent(self, job: Job) -> str:
        return f"{job.progress_fraction:.0%}"

    # -- detail ---------------------------------------------------------------------------------
    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempts} of at most {job.max_attempts}"

    @admin.display(description="input")
    def input_display(self, job: Job) -> str:
        return json_block(job.input)

    @admin.display(description="error (with its traceback)")
    def error_display(self, job: Job) -> str:
        """The whole error, traceback included, for staff (pages and the API show it without)."""
        return json_block(job.error)

    @admin.display(description="checkpoint (finished steps)")
    def checkpoint_display(self, job: Job) -> str:
        return json_block(job.checkpoint)

    @admin.display(description="created")
    def created_display(self, job: Job) -> str:
        return time_with_age(job.created_at)

    @admin.display(description="updated")
    def updated_display(self, job: Job) -> str:
        return time_with_age(job.updated_at)

    @admin.display(description="started")
    def started_display(self, job: Job) -> str:
        return time_with_age(job.started_at)

    @admin.display(description="finished")
    def finished_display(self, job: Job) -> str:
        return time_with_age(job.finished_at)

    @admin.display(description="runs again after")
    def run_after_display(self, job: Job) -> str:
        return time_with_age(job.run_after)

    def get_fieldsets(self, request, obj=None):
        """Rows with nothing to say are left out (no checkpoint yet, no retry due)."""
        if obj is None:
            return self.fieldsets
        empty = {"checkpoint_display": not obj.checkpoint, "error_display": not obj.error,
                 "run_after_display": obj.run_after is None,
                 "started_display": obj.started_at is None, "finished_display": obj.finished_at is None}
        fieldsets = []
        for name, options in self.fieldsets:
            fields = [field for field in options["fields"] if not empty.get(field)]
            if fields:
                fieldsets.append((name, {**options, "fields": fields}))
        return fieldsets

    @admin.display(description="parent and children")
    def family(self, job: Job) -> str:
        """The job that spawned this one, and how the jobs it spawned stand (`ctx.spawn`)."""
        parts = []
        if job.parent_id:
            parent = Job.objects.filter(pk=job.parent_id).only("kind").first()
            parts.append(format_html('spawned by <a href="{}">{} {}</a> as <code>{}</code>',
                                     reverse("admin:jobs_job_change", args=[job.parent_id]),
                                     parent.kind if parent else "job", str(job.parent_id)[:8], job.spawn_key))
        counts = job_children_counts(job)
        if counts:
            summary = ", ".join(f"{count} {status}" for status, count in counts.items())
            url = reverse("admin:jobs_job_changelist") + f"?parent__id__exact={job.pk}"
            parts.append(format_html('<a href="{}">{} children</a>: {}', url, sum(counts.values()), summary))
        return mark_safe("<br>".join(parts)) if parts else "—"  # each part is built with format_html

    def lookup_allowed(self, lookup, value, request=None):
        return lookup == "parent__id__exact" or super().lookup_allowed(lookup, value, request)

    @admin.display(description="links")
    def links(self, job: Job) -> str:
        """What the feature apps link to (`jobs.extensions.job_admin_link`: the job's tasks in Flower)."""
        parts = [part for part in (link(job) for link in job_admin_links()) if part]
        return mark_safe(" · ".join(parts)) if parts else "—"  # each part is built with format_html

    def get_inlines(self, request, obj):
        return [*job_admin_inlines(), *self.inlines]

    def get_inline_instances(self, request, obj=None):
        """On a job's page, only the inlines that have rows for it: no empty "Decisions" or
        "Waits" headers on a job that asked nothing and waited for nothing."""
        instances = super().get_inline_instances(request, obj)
        if obj is None:
            return instances
        shown = []
        for inline in instances:
            fk = _get_foreign_key(Job, inline.model, fk_name=inline.fk_name)
            if inline.get_queryset(request).filter(**{fk.name: obj}).exists():
                shown.append(inline)
        return shown

    def has_change_permission(self, request, obj=None):
        return False  # read-only: changes go through actions that call the services

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser

    def change_view(self, request, object_id, form_url="", extra_context=None):
        from jobs.pages import live_context

        job = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if job is not None:
            live = live_context(request, job)
            live["live_job"] = live.pop("job")
            extra.update(live)
        return super().change_view(request, object_id, form_url, extra_context=extra)

    # -- submitting a job -------------------------------------------------------------------
    def add_view(self, request, form_url="", extra_context=None):
        """The "add" page submits a job through `job_submit` (validated like the API)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = JobSubmitForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                job, _ = job_submit(
                    kind=form.cleaned_data["kind"], input=form.cleaned_data["input"], owner=request.user
                )
            except PlatformError as exc:
                form.add_error("input" if exc.field and exc.field.startswith("input") else None, exc.message)
            else:
                self.message_user(request, f"Submitted {job.kind} job {job.pk}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[job.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": "Submit a job",
            "form": form,
            "opts": self.model._meta,
            "kinds": kinds_all(),
            "kind_schemas": {k.name: k.input_schema for k in kinds_all()},
        }
        return TemplateResponse(request, "admin/jobs/job/submit.html", context)

    # -- actions ------------------------------------------------------------------------------
    def _apply(self, request, queryset, service, verb: str) -> None:
        admin_apply_each(
            self, request, queryset, lambda job: service(job_id=job.pk, actor=request.user),
            verb=verb, noun="job", describe=lambda job: str(job.pk)[:8],
        )

    def has_operate_permission(self, request) -> bool:
        """Cancel and retry need Django's "change job" permission (fields stay read-only)."""
        return request.user.has_perm("jobs.change_job")

    @admin.action(description="Cancel selected jobs", permissions=["operate"])
    def cancel_jobs(self, request, queryset):
        self._apply(request, queryset, partial(job_cancel, channel="admin"), "Cancelled")

    @admin.action(description="Retry selected failed or cancelled jobs", permissions=["operate"])
    def retry_jobs(self, request, queryset):
        self._apply(request, queryset, job_retry, "Retried")
