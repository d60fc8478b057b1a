"""The pages people look at: the job list (filters, search by id, paging, "Submit a job") and one
job's live page.

Plain templates (`templates/jobs/`) and one small script (`jobs/static/jobs/live.js`) that
follows `/ws/jobs/` and `/ws/jobs/{id}/`; each event reads as the sentence of
`jobs.presenters.event_text`, whoever renders it. What the feature apps show on a job's page (the open
questions and their answer forms, from `approvals.pages`) comes in as sections registered with
`jobs.extensions.job_section`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from jobs.errors import InvalidInput, JobNotFound, UnknownKind
from jobs.extensions import job_sections
from jobs.forms import JobInputForm
from jobs.models import Job
from jobs.presenters import job_error_public, json_pretty, time_with_age
from jobs.registry import kind_get, kinds_all
from jobs.selectors import job_children_counts, job_get_visible, jobs_visible_to
from jobs.services import job_submit

LIST_PAGE_SIZE = 50  # jobs a page on /jobs/
TIMELINE_LIMIT = 50  # newest events rendered with the page; live ones are appended, earlier ones paged in


def visible_or_404(request: HttpRequest, job_id: Any) -> Job:
    try:
        return job_get_visible(user=request.user, job_id=job_id)
    except JobNotFound as exc:
        raise Http404(exc.message) from exc


def event_row(event: Any) -> dict[str, Any]:
    """An event as the timeline shows it: its JSON, with `text` (`jobs.presenters.event_text`),
    which the script shows for pushed events too."""
    return event.as_dict()


def live_context(
    request: HttpRequest, job: Job, *, next_url: str | None = None, posted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What `jobs/_live.html` needs: the job, its newest events, and its panel."""
    last_seq = job.event_seq
    newest = list(job.events.filter(seq__lte=last_seq).order_by("-seq")[:TIMELINE_LIMIT])
    return {
        "job": job,
        "events": [event_row(event) for event in reversed(newest)],
        "last_seq": last_seq,
        "hidden_events": max(last_seq - len(newest), 0),
        **job_facts(job),
        **panel_context(request, job, next_url=next_url or request.get_full_path(), posted=posted),
    }


def panel_context(
    request: HttpRequest, job: Job, *, next_url: str, posted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The part of the page that changes with the job's status: result, error, and the feature
    apps' sections (`jobs.extensions.job_section`), such as the open questions.

    `posted` is what a feature's own view hands back to its section when it shows the page again
    (the answer form that came back with errors), by section name.
    """
    sections = []
    for section in job_sections():
        context = section.context(request, job, next_url=next_url, posted=(posted or {}).get(section.name))
        if context is not None:
            sections.append({"name": section.name, "template": section.template, "context": context})
    return {
        "job": job,
        "result_json": json_pretty(job.result) if job.result is not None else "",
        "error_json": json_pretty(job_error_public(job.error)) if job.error else "",
        "sections": sections,
        "next_url": next_url,
    }


def safe_next(request: HttpRequest, next_url: str | None, job: Job) -> str:
    """`next_url` when it stays on this site, else the job's page."""
    if next_url and url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        return next_url
    return reverse("jobs:job-detail", args=[job.pk])


@dataclass(frozen=True)
class ListFilters:
    """What `/jobs/` is narrowed to: `status`, `kind`, and `q` (a job's id, or its first characters)."""

    status: str = ""
    kind: str = ""
    q: str = ""

    @classmethod
    def from_query(cls, query: Any) -> ListFilters:
        status = query.get("status", "")
        return cls(status=status if status in Job.Status.values else "", kind=query.get("kind", "")[:100],
                   q=query.get("q", "").strip().lower()[:36])

    def apply(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        if self.status:
            jobs = jobs.filter(status=self.status)
        if self.kind:
            jobs = jobs.filter(kind=self.kind)
        if self.q:
            jobs = jobs.filter(id_filter(self.q))
        return jobs

    def query(self, **changes: Any) -> str:
        """The query string of these filters (with `changes`), for links that keep them."""
        values = {"status": self.status, "kind": self.kind, "q": self.q, **changes}
        return urlencode({key: value for key, value in values.items() if value})


def id_filter(text: str) -> Q:
    """A job id, whole or its first characters (the 8 the pages show), dashes or not. Anything
    that cannot begin an id matches nothing."""
    hexdigits = text.replace("-", "")
    if not hexdigits or len(hexdigits) > 32 or any(c not in "0123456789abcdef" for c in hexdigits):
        return Q(pk__in=[])
    if len(hexdigits) == 32:
        return Q(pk=uuid.UUID(hexdigits))
    low = uuid.UUID(hexdigits.ljust(32, "0"))
    high = uuid.UUID(hexdigits.ljust(32, "f"))
    return Q(pk__gte=low, pk__lte=high)  # a range on the primary key's index


def submit_context(*, kind_name: str | None = None, form: JobInputForm | None = None) -> dict[str, Any]:
    """The "Submit a job" form: the kinds to choose from, and the fields of the chosen one
    (`?submit_kind=KIND`, else the first), built from its input schema (`jobs.forms.JobInputForm`)."""
    kinds = kinds_all()
    if not kinds:
        return {"submit_kinds": []}
    chosen = form.kind if form is not None else next((k for k in kinds if k.name == kind_name), kinds[0])
    return {
        "submit_kinds": kinds,
        "submit_kind": chosen,
        "submit_form": form if form is not None else JobInputForm(chosen, auto_id="submit_%s"),
    }


def job_list_context(request: HttpRequest, **submit: Any) -> dict[str, Any]:
    filters = ListFilters.from_query(request.GET)
    jobs = filters.apply(jobs_visible_to(request.user)).select_related("owner").order_by("-created_at", "-id")
    paginator = Paginator(jobs, LIST_PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    known_kinds = sorted({kind.name for kind in kinds_all()} | ({filters.kind} if filters.kind else set()))
    return {
        "page": page,
        "jobs": page.object_list,
        "filters": filters,
        "filtered": bool(filters.status or filters.kind or filters.q),
        "filter_items": [(name, value) for name, value in vars(filters).items() if value],
        "statuses": Job.Status.values,
        "kinds": known_kinds,
        "previous_query": filters.query(page=page.previous_page_number()) if page.has_previous() else "",
        "next_query": filters.query(page=page.next_page_number()) if page.has_next() else "",
        # Pushed jobs join the top of the first page when they match the filters (live.js).
        "live_rows": page.number == 1,
        **submit_context(**submit),
    }


@login_required
@require_GET
def job_list_page(request: HttpRequest) -> HttpResponse:
    """`/jobs/`: the jobs the user may see, newest first, filtered by status and kind, searched
    by id, a page at a time; statuses follow `/ws/jobs/` live. Beside them, "Submit a job"."""
    return render(request, "jobs/job_list.html", job_list_context(request, kind_name=request.GET.get("submit_kind")))


@login_required
@require_POST
def job_submit_page(request: HttpRequest) -> HttpResponse:
    """The "Submit a job" form: the fields become the input, and `job_submit` (the API's service)
    validates it against the kind's schema and creates the job, owned by the user. A schema
    error comes back next to its field (400); a new job opens its page."""
    try:
        kind = kind_get(request.POST.get("kind", ""))
    except UnknownKind as exc:
        messages.error(request, f"The job was not submitted: {exc.message}")
        return HttpResponseRedirect(reverse("jobs:job-list"))
    form = JobInputForm(kind, request.POST, auto_id="submit_%s")
    if form.is_valid():
        try:
            job, _ = job_submit(kind=kind.name, input=form.value(), owner=request.user)
        except InvalidInput as exc:
            form.add_input_error(exc)
        else:
            messages.success(request, f"Submitted {job.kind} job {str(job.pk)[:8]}.")
            return HttpResponseRedirect(reverse("jobs:job-detail", args=[job.pk]))
    return render(request, "jobs/job_list.html", job_list_context(request, form=form), status=400)


@login_required
@require_GET
def job_detail_page(request: HttpRequest, job_id: Any) -> HttpResponse:
    """`/jobs/{id}/`: progress bar, status, the growing timeline, result or error, answer form."""
    job = visible_or_404(request, job_id)
    return render(request, "jobs/job_detail.html", {**live_context(request, job), **family_context(request, job)})


CHILDREN_SHOWN = 50


def family_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    """The job's parent (a child's questions say which job they belong to) and its children:
    counts by status, and the first ones the viewer may see."""
    counts = job_children_counts(job)
    visible = jobs_visible_to(request.user, per_row=True)  # one job's family
    children = list(visible.filter(parent_id=job.pk).order_by("created_at", "pk")[:CHILDREN_SHOWN]) if counts else []
    return {
        "parent_job": Job.objects.filter(pk=job.parent_id).first() if job.parent_id else None,
        "parent_visible": bool(job.parent_id) and visible.filter(pk=job.parent_id).exists(),
        "children_counts": counts,
        "children_total": sum(counts.values()),
        "children": children,
    }


def job_facts(job: Job) -> dict[str, Any]:
    """What the job page says about a job besides its live part: its input as JSON, when it
    was created and by whom."""
    return {
        "input_json": json_pretty(job.input),
        "created": time_with_age(job.created_at),
    }


@login_required
@require_GET
def job_panel(request: HttpRequest, job_id: Any) -> HttpResponse:
    """The panel alone, fetched by the script when the job's status or questions change."""
    job = visible_or_404(request, job_id)
    return render(request, "jobs/_panel.html",
                  panel_context(request, job, next_url=safe_next(request, request.GET.get("next"), job)))
