"""The pages people look at: the job list and one job's live page.

Plain templates (`templates/jobs/`) and one small script (`jobs/static/jobs/live.js`) that
follows `/ws/jobs/` and `/ws/jobs/{id}/`. What the feature apps show on a job's page (the open
questions and their answer forms, from `approvals.pages`) comes in as sections registered with
`jobs.extensions.job_section`.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET

from jobs.errors import JobNotFound
from jobs.extensions import job_sections
from jobs.models import Job
from jobs.selectors import job_get_visible, jobs_visible_to

LIST_LIMIT = 200  # newest jobs on /jobs/
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
        "result_json": json.dumps(job.result, indent=2, sort_keys=True) if job.result is not None else "",
        "error_json": json.dumps(job.error, indent=2, sort_keys=True) if job.error else "",
        "sections": sections,
        "next_url": next_url,
    }


def safe_next(request: HttpRequest, next_url: str | None, job: Job) -> str:
    """`next_url` when it stays on this site, else the job's page."""
    if next_url and url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        return next_url
    return reverse("jobs:job-detail", args=[job.pk])


@login_required
@require_GET
def job_list_page(request: HttpRequest) -> HttpResponse:
    """`/jobs/`: the newest jobs the user may see; statuses follow `/ws/jobs/` live."""
    jobs = list(jobs_visible_to(request.user).select_related("owner").order_by("-created_at")[:LIST_LIMIT])
    return render(request, "jobs/job_list.html", {"jobs": jobs, "limit": LIST_LIMIT})


@login_required
@require_GET
def job_detail_page(request: HttpRequest, job_id: Any) -> HttpResponse:
    """`/jobs/{id}/`: progress bar, status, the growing timeline, result or error, answer form."""
    job = visible_or_404(request, job_id)
    return render(request, "jobs/job_detail.html", live_context(request, job))


@login_required
@require_GET
def job_panel(request: HttpRequest, job_id: Any) -> HttpResponse:
    """The panel alone, fetched by the script when the job's status or questions change."""
    job = visible_or_404(request, job_id)
    return render(request, "jobs/_panel.html",
                  panel_context(request, job, next_url=safe_next(request, request.GET.get("next"), job)))
