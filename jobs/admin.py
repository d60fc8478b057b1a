"""The jobs in the admin: submit a job, watch it, cancel or retry it. Status is read-only here;
every change goes through `jobs.services`."""

from __future__ import annotations

import uuid
from functools import partial

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import CharField
from django.db.models.functions import Cast, Left
from django.forms.models import _get_foreign_key
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from jobs.admin_actions import admin_apply_each
from jobs.errors import PlatformError
from jobs.extensions import job_admin_inlines, job_admin_links
from jobs.json_input import json_parse
from jobs.models import Job, JobStep
from jobs.presenters import json_block, time_with_age
from jobs.registry import kinds_all
from jobs.selectors import job_children_counts
from jobs.services import job_cancel, job_retry, job_submit

# A job's page lists its newest finished steps, each result cut to a preview; the steps' own list
# (JobStepAdmin, a page at a time) has them all, and a step's page its whole result. The page
# once showed every step's whole result in one block: a job of a thousand 1 kB steps made a page
# of over a megabyte.
STEPS_SHOWN = 10
STEP_RESULT_PREVIEW = 200  # characters of a result's JSON in a list of steps


def steps_with_previews():
    """A job's steps, their results left in the database but for their first characters
    (`result_preview`, one more than shown: a longer one is cut)."""
    return JobStep.objects.defer("result").annotate(
        result_preview=Left(Cast("result", output_field=CharField()), STEP_RESULT_PREVIEW + 1))


def step_preview(step: JobStep) -> str:
    text = step.result_preview
    return text if len(text) <= STEP_RESULT_PREVIEW else text[:STEP_RESULT_PREVIEW] + "…"


def steps_newest(job: Job) -> tuple[list[JobStep], int]:
    """The job's newest `STEPS_SHOWN` finished steps, newest first, and how many it has: read
    once for the page (its block, and whether to show it)."""
    kept = job.__dict__.get("_admin_steps")
    if kept is None:
        newest = list(steps_with_previews().filter(job=job).order_by("-id")[:STEPS_SHOWN + 1])
        count = len(newest) if len(newest) <= STEPS_SHOWN else JobStep.objects.filter(job=job).count()
        kept = job.__dict__["_admin_steps"] = (newest[:STEPS_SHOWN], count)
    return kept


def job_steps_url(job_id: object) -> str:
    return reverse("admin:jobs_jobstep_changelist") + f"?job__id__exact={job_id}"


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
        ("Data", {"fields": ("input_display", "error_display", "steps_display")}),
        ("Times (UTC)", {"fields": ("created_display", "updated_display", "started_display", "finished_display",
                                    "run_after_display")}),
    )
    readonly_fields = (
        "id", "kind", "owner", "attempts_display", "input_display", "error_display", "steps_display",
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

    @admin.display(description="finished steps")
    def steps_display(self, job: Job) -> str:
        """The newest finished steps (`ctx.step`: skipped when the job runs again), each result's
        first characters; all of them a page at a time on the steps' own list."""
        newest, count = steps_newest(job)
        if count > len(newest):
            said = format_html('{} finished, the newest {} here: <a href="{}">all {} steps</a>',
                               count, len(newest), job_steps_url(job.pk), count)
        else:
            said = format_html("{} finished, the newest first", count)
        rows = format_html_join("", '<tr><td><a href="{}"><code>{}</code></a></td><td>{}</td><td>{}</td>'
                                    '<td><code class="step-result">{}</code></td></tr>',
                                ((reverse("admin:jobs_jobstep_change", args=[step.pk]), step.name, step.attempt,
                                  time_with_age(step.finished_at), step_preview(step)) for step in newest))
        return format_html('<p class="steps-said">{}</p><table class="job-steps"><thead><tr><th>step</th>'
                           "<th>attempt</th><th>finished</th><th>result</th></tr></thead><tbody>{}</tbody></table>",
                           said, rows)

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
        """Rows with nothing to say are left out (no finished step yet, no retry due)."""
        if obj is None:
            return self.fieldsets
        empty = {"steps_display": not steps_newest(obj)[1], "error_display": not obj.error,
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


@admin.register(JobStep)
class JobStepAdmin(admin.ModelAdmin):
    """A job's finished steps, a page at a time, reached from the job's page (not listed on the
    admin's index: steps are read per job). Read-only, like the job; whoever may view jobs may
    view their steps."""

    list_display = ("name", "attempt", "finished_display", "result_preview_display")
    list_display_links = ("name",)
    search_fields = ("name",)
    ordering = ("-id",)  # the newest first, as on the job's page
    list_per_page = 100
    show_full_result_count = False
    fields = ("job_display", "name", "attempt", "finished_display", "result_display")
    readonly_fields = fields

    class Media:
        css = {"all": ("jobs/admin.css",)}

    def get_queryset(self, request):
        return steps_with_previews()

    def lookup_allowed(self, lookup, value, request=None):
        return lookup == "job__id__exact" or super().lookup_allowed(lookup, value, request)

    def changelist_view(self, request, extra_context=None):
        """Only one job's steps: all of every job's would be the largest table's count and pages."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        job_id = request.GET.get("job__id__exact", "")
        job = Job.objects.filter(pk=job_id).only("kind").first() if _is_uuid(job_id) else None
        if job is None:
            self.message_user(request, "A job's steps are listed from its page: open the job, then "
                                       "\"all … steps\".", messages.INFO)
            return HttpResponseRedirect(reverse("admin:jobs_job_changelist"))
        title = f"Finished steps of {job.kind} job {str(job.pk)[:8]}"
        return super().changelist_view(request, extra_context={**(extra_context or {}), "title": title,
                                                               "subtitle": None})

    @admin.display(description="finished", ordering="finished_at")
    def finished_display(self, step: JobStep) -> str:
        return time_with_age(step.finished_at)

    @admin.display(description="result")
    def result_preview_display(self, step: JobStep) -> str:
        return format_html('<code class="step-result">{}</code>', step_preview(step))

    @admin.display(description="job")
    def job_display(self, step: JobStep) -> str:
        return format_html('<a href="{}">{}</a> · <a href="{}">its steps</a>',
                           reverse("admin:jobs_job_change", args=[step.job_id]), step.job_id,
                           job_steps_url(step.job_id))

    @admin.display(description="result")
    def result_display(self, step: JobStep) -> str:
        return json_block(step.result)

    def has_module_permission(self, request) -> bool:
        return False  # not on the index: a job's page links to its steps

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("jobs.view_job")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a step goes with its job


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
