"""The questions on a job's page (`/jobs/{id}/`): the open ones with their typed answer forms
(`approvals.forms.answer_form_for`: buttons, radio buttons, checkboxes, a text area, one field
per property), and the view that takes an answer from that form through
`approvals.services.question_answer`, the same service and permission check as the admin and
the API. The section is shown on the job's page through `jobs.extensions.job_section`.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from approvals.forms import AnswerForm, JsonAnswerForm, answer_form_for
from approvals.models import Decision, Question
from approvals.policies import policy_describe
from approvals.rendering import answered_message, details_html
from approvals.schemas import schema_summary
from approvals.selectors import questions_visible_to
from approvals.services import (
    InvalidAnswer,
    NotAllowedToAnswer,
    question_answer,
    question_check_can_answer,
    request_client_address,
)
from jobs.errors import PlatformError
from jobs.models import Job
from jobs.pages import live_context, safe_next, visible_or_404

SECTION = "questions"


def answer_refusal(question: Question, user: Any) -> str | None:
    """Why `user` may not answer `question` now, in words; None when they may. The permission
    rule is `question_check_can_answer`, the service's own (it checks again when answering)."""
    if question.status == Question.Status.ANSWERED:
        by = question.answered_by.get_username() if question.answered_by else "the system"
        return f"this question was already answered by {by}"
    if question.status != Question.Status.OPEN:
        return f"this question is {question.status} and can no longer be answered"
    if question.expires_at is not None and question.expires_at <= timezone.now():
        return f"its deadline passed at {question.expires_at:%Y-%m-%d %H:%M:%S} UTC; its policy applies within moments"
    try:
        question_check_can_answer(question=question, user=user)
    except NotAllowedToAnswer as exc:
        return exc.message
    return None


def answer_form(question: Question, data: Any = None) -> AnswerForm:
    """The question's typed answer form (`approvals.forms`, as in the admin), with element ids of
    its own so that two questions on one page never share one."""
    return answer_form_for(question, data, auto_id=f"q{question.pk.hex[:8]}_%s")


def open_questions_section(
    request: HttpRequest, job: Job, *, next_url: str, posted: dict[Any, AnswerForm] | None = None,
) -> dict[str, Any] | None:
    """The open questions of `job` that the viewer may see, each with a fresh answer form for a
    viewer who may answer it (or the posted one that came back with errors, by question id),
    else the reason why not. None (nothing shown) when there is no open question."""
    user = request.user
    open_questions = []
    questions = (questions_visible_to(user, per_row=True).filter(job=job, status=Question.Status.OPEN)
                 .select_related("job").prefetch_related("assigned_users", "assigned_groups"))
    for question in questions.order_by("created_at"):
        refusal = answer_refusal(question, user)
        form = None
        if refusal is None:
            form = (posted or {}).get(question.pk) or answer_form(question)
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
                "asked_again": question.asked_again_text(),
                "not_allowed": refusal,
                "form": form,
                "schema_json": json.dumps(question.schema, indent=2, sort_keys=True)
                if isinstance(form, JsonAnswerForm) else "",
                "answer_url": reverse("approvals:question-answer", args=[job.pk, question.pk]),
            }
        )
    if not open_questions:
        return None
    return {"open_questions": open_questions}


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
    job = visible_or_404(request, job_id)
    back = safe_next(request, request.POST.get("next"), job)
    question = (questions_visible_to(request.user, per_row=True).select_related("job", "answered_by")
                .filter(job=job, pk=question_id).first())
    if question is None:
        raise Http404("no such question on this job")
    form = answer_form(question, request.POST)
    if form.is_valid():
        try:
            question = question_answer(
                question_id=question.pk, user=request.user, answer=form.answer(), comment=form.comment(),
                channel=Decision.Channel.WEB, client_address=request_client_address(request), job_id=question.job_id,
            )
        except InvalidAnswer as exc:
            form.add_answer_error(exc)
        except PlatformError as exc:
            messages.error(request, f"The answer was not recorded: {exc.message}")
            return HttpResponseRedirect(back)
        else:
            messages.success(request, answered_message(question))
            return HttpResponseRedirect(back)
    refusal = answer_refusal(question, request.user)
    if refusal:  # the form would not be shown again: say why instead
        messages.error(request, f"The answer was not recorded: {refusal}")
        return HttpResponseRedirect(back)
    context = live_context(request, job, next_url=back, posted={SECTION: {question.pk: form}})
    return render(request, "jobs/job_detail.html", context, status=400)
