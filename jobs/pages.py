"""The pages people look at: the job list and one job's live page with its answer form.

Plain templates (`templates/jobs/`) and one small script (`jobs/static/jobs/live.js`) that
follows `/ws/jobs/` and `/ws/jobs/{id}/`. Answers go through `approvals.services.question_answer`,
the same service and permission check as the admin and the API.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from approvals.models import Question
from approvals.schemas import is_approval
from approvals.selectors import questions_visible_to
from approvals.services import (
    InvalidAnswer,
    NotAllowedToAnswer,
    question_answer,
    question_check_can_answer,
    request_client_address,
)
from jobs.errors import JobNotFound, PlatformError
from jobs.models import Job
from jobs.selectors import job_get_visible, jobs_visible_to

LIST_LIMIT = 200  # newest jobs on /jobs/
TIMELINE_LIMIT = 300  # newest events rendered with the page; live ones are appended


def _visible_or_404(request: HttpRequest, job_id: Any) -> Job:
    try:
        return job_get_visible(user=request.user, job_id=job_id)
    except JobNotFound as exc:
        raise Http404(exc.message) from exc


def event_row(event: Any) -> dict[str, Any]:
    """An event as the timeline shows it (the script renders pushed events the same way)."""
    data = event.as_dict()
    data["message_json"] = json.dumps(data["message"], sort_keys=True) if data["message"] else ""
    return data


def live_context(request: HttpRequest, job: Job, *, next_url: str | None = None) -> dict[str, Any]:
    """What `jobs/_live.html` needs: the job, its newest events, and its panel."""
    last_seq = job.event_seq
    newest = list(job.events.filter(seq__lte=last_seq).order_by("-seq")[:TIMELINE_LIMIT])
    return {
        "job": job,
        "events": [event_row(event) for event in reversed(newest)],
        "last_seq": last_seq,
        "hidden_events": max(last_seq - len(newest), 0),
        **panel_context(request, job, next_url=next_url or request.get_full_path()),
    }


def panel_context(request: HttpRequest, job: Job, *, next_url: str) -> dict[str, Any]:
    """The part of the page that changes with the job's status: result, error, open questions."""
    open_questions = []
    questions = questions_visible_to(request.user).filter(job=job, status=Question.Status.OPEN)
    for question in questions.order_by("created_at"):
        try:
            question_check_can_answer(question=question, user=request.user)
            may_answer = True
        except NotAllowedToAnswer:
            may_answer = False
        open_questions.append(
            {
                "question": question,
                "details_json": json.dumps(question.details, indent=2, sort_keys=True),
                "schema_json": json.dumps(question.schema, indent=2, sort_keys=True),
                "is_approval": is_approval(question.schema),
                "may_answer": may_answer,
                "answer_url": reverse("jobs:question-answer", args=[job.pk, question.pk]),
            }
        )
    return {
        "job": job,
        "result_json": json.dumps(job.result, indent=2, sort_keys=True) if job.result is not None else "",
        "error_json": json.dumps(job.error, indent=2, sort_keys=True) if job.error else "",
        "open_questions": open_questions,
        "next_url": next_url,
    }


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
    job = _visible_or_404(request, job_id)
    return render(request, "jobs/job_detail.html", live_context(request, job))


@login_required
@require_GET
def job_panel(request: HttpRequest, job_id: Any) -> HttpResponse:
    """The panel alone, fetched by the script when the job's status or questions change."""
    job = _visible_or_404(request, job_id)
    next_url = request.GET.get("next") or reverse("jobs:job-detail", args=[job.pk])
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = reverse("jobs:job-detail", args=[job.pk])
    return render(request, "jobs/_panel.html", panel_context(request, job, next_url=next_url))


@login_required
@require_POST
def question_answer_view(request: HttpRequest, job_id: Any, question_id: Any) -> HttpResponse:
    """Answer an open question from the job page (Approve / Reject, or JSON)."""
    job = _visible_or_404(request, job_id)
    back = request.POST.get("next") or reverse("jobs:job-detail", args=[job.pk])
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = reverse("jobs:job-detail", args=[job.pk])
    question = questions_visible_to(request.user).filter(job=job, pk=question_id).first()
    if question is None:
        raise Http404("no such question on this job")
    try:
        answer, comment = _answer_from_form(question, request.POST)
        question_answer(question_id=question.pk, user=request.user, answer=answer, comment=comment, channel="web",
                        client_address=request_client_address(request))
    except PlatformError as exc:
        messages.error(request, f"The answer was not recorded: {exc.message}")
    else:
        messages.success(request, "Answer recorded; the job resumes.")
    return HttpResponseRedirect(back)


def _answer_from_form(question: Question, data: Any) -> tuple[Any, str]:
    """Approve/Reject buttons with a reason, or a JSON answer for any other schema."""
    reason = (data.get("reason") or "").strip()
    if is_approval(question.schema):
        if "_approve" not in data and "_reject" not in data:
            raise InvalidAnswer("press Approve or Reject", field="answer.approved")
        answer: dict[str, Any] = {"approved": "_approve" in data}
        if reason:
            answer["reason"] = reason
        return answer, reason
    try:
        return json.loads(data.get("answer_json") or ""), (data.get("comment") or "").strip()
    except json.JSONDecodeError as exc:
        raise InvalidAnswer(f"answer: not valid JSON: {exc}", field="answer") from exc
