"""The pages people look at: the job list and one job's live page with its answer form.

Plain templates (`templates/jobs/`) and one small script (`jobs/static/jobs/live.js`) that
follows `/ws/jobs/` and `/ws/jobs/{id}/`. An open question is answered with the admin's typed
form for its schema (`approvals.forms.answer_form_for`: buttons, radio buttons, checkboxes, a
text area, one field per property), through `approvals.services.question_answer`, the same
service and permission check as the admin and the API.
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

from approvals.forms import AnswerForm, JsonAnswerForm, answer_form_for
from approvals.models import Decision, Question
from approvals.policies import policy_describe
from approvals.rendering import details_html
from approvals.schemas import schema_summary
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
from jobs.presenters import job_error_public
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


def live_context(
    request: HttpRequest, job: Job, *, next_url: str | None = None, answer_forms: dict[Any, AnswerForm] | None = None,
) -> dict[str, Any]:
    """What `jobs/_live.html` needs: the job, its newest events, and its panel."""
    last_seq = job.event_seq
    newest = list(job.events.filter(seq__lte=last_seq).order_by("-seq")[:TIMELINE_LIMIT])
    return {
        "job": job,
        "events": [event_row(event) for event in reversed(newest)],
        "last_seq": last_seq,
        "hidden_events": max(last_seq - len(newest), 0),
        **panel_context(request, job, next_url=next_url or request.get_full_path(), answer_forms=answer_forms),
    }


def answer_refusal(question: Question, user: Any) -> str | None:
    """Why `user` may not answer `question` now, in words; None when they may. The permission
    rule is `question_check_can_answer`, the service's own (it checks again when answering)."""
    if question.status == Question.Status.ANSWERED:
        by = question.answered_by.get_username() if question.answered_by else "the system"
        return f"this question was already answered by {by}"
    if question.status != Question.Status.OPEN:
        return f"this question is {question.status} and can no longer be answered"
    try:
        question_check_can_answer(question=question, user=user)
    except NotAllowedToAnswer as exc:
        return exc.message
    return None


def answer_form(question: Question, data: Any = None) -> AnswerForm:
    """The question's typed answer form (`approvals.forms`, as in the admin), with element ids of
    its own so that two questions on one page never share one."""
    return answer_form_for(question, data, auto_id=f"q{question.pk.hex[:8]}_%s")


def panel_context(
    request: HttpRequest, job: Job, *, next_url: str, answer_forms: dict[Any, AnswerForm] | None = None,
) -> dict[str, Any]:
    """The part of the page that changes with the job's status: result, error, open questions.

    `answer_forms` holds the posted forms that came back with errors, by question id; the other
    open questions get a fresh form for a viewer who may answer them, else the reason why not.
    """
    user = request.user
    open_questions = []
    questions = (questions_visible_to(user).filter(job=job, status=Question.Status.OPEN)
                 .select_related("job").prefetch_related("assigned_users", "assigned_groups"))
    for question in questions.order_by("created_at"):
        refusal = answer_refusal(question, user)
        form = None
        if refusal is None:
            posted = (answer_forms or {}).get(question.pk)
            form = posted if posted is not None else answer_form(question)
        quorum = question.required_approvals > 1
        open_questions.append(
            {
                "question": question,
                "details_html": details_html(question.details),
                "asks": schema_summary(question.schema),
                "assignees": ", ".join(question.assignee_names()) or "superusers only",
                "approvals": question.approvals_so_far() if quorum else None,
                "you_approved": quorum and user.is_authenticated and question.decisions.filter(
                    round=question.round, kind=Decision.Kind.APPROVED, actor=user).exists(),
                "then": policy_describe(question.on_timeout) if question.expires_at else "",
                "not_allowed": refusal,
                "form": form,
                "schema_json": json.dumps(question.schema, indent=2, sort_keys=True)
                if isinstance(form, JsonAnswerForm) else "",
                "answer_url": reverse("jobs:question-answer", args=[job.pk, question.pk]),
            }
        )
    return {
        "job": job,
        "result_json": json.dumps(job.result, indent=2, sort_keys=True) if job.result is not None else "",
        "error_json": json.dumps(job_error_public(job.error), indent=2, sort_keys=True) if job.error else "",
        "open_questions": open_questions,
        "next_url": next_url,
    }


def _safe_next(request: HttpRequest, next_url: str | None, job: Job) -> str:
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
    job = _visible_or_404(request, job_id)
    return render(request, "jobs/job_detail.html", live_context(request, job))


@login_required
@require_GET
def job_panel(request: HttpRequest, job_id: Any) -> HttpResponse:
    """The panel alone, fetched by the script when the job's status or questions change."""
    job = _visible_or_404(request, job_id)
    return render(request, "jobs/_panel.html",
                  panel_context(request, job, next_url=_safe_next(request, request.GET.get("next"), job)))


@login_required
@require_POST
def question_answer_view(request: HttpRequest, job_id: Any, question_id: Any) -> HttpResponse:
    """Answer an open question from the job page with its typed form.

    The form turns the fields into the answer; `question_answer` checks who may answer and the
    schema, as for the admin and the API, and records the decision on the channel `web`. A form
    with errors (the form's own, or the schema's as the service reports them) comes back on the
    job's page with the errors next to their fields (400); a refusal that no field can fix
    (already answered, not allowed, closed) is a message on the page the form was on.
    """
    job = _visible_or_404(request, job_id)
    back = _safe_next(request, request.POST.get("next"), job)
    question = (questions_visible_to(request.user).select_related("job", "answered_by")
                .filter(job=job, pk=question_id).first())
    if question is None:
        raise Http404("no such question on this job")
    form = answer_form(question, request.POST)
    if form.is_valid():
        try:
            question = question_answer(
                question_id=question.pk, user=request.user, answer=form.answer(), comment=form.comment(),
                channel=Decision.Channel.WEB, client_address=request_client_address(request),
            )
        except InvalidAnswer as exc:
            form.add_answer_error(exc)
        except PlatformError as exc:
            messages.error(request, f"The answer was not recorded: {exc.message}")
            return HttpResponseRedirect(back)
        else:
            messages.success(request, _answered_message(question))
            return HttpResponseRedirect(back)
    refusal = answer_refusal(question, request.user)
    if refusal:  # the form would not be shown again: say why instead
        messages.error(request, f"The answer was not recorded: {refusal}")
        return HttpResponseRedirect(back)
    context = live_context(request, job, next_url=back, answer_forms={question.pk: form})
    return render(request, "jobs/job_detail.html", context, status=400)


def _answered_message(question: Question) -> str:
    if question.status == Question.Status.OPEN:  # a vote towards a quorum
        return (f"Your approval is recorded ({question.approvals_so_far()} of {question.required_approvals}); "
                "the question waits for another reviewer.")
    return "Answer recorded; the job resumes."
