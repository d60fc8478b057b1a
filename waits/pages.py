"""A combined wait on the job's page (`/jobs/{id}/`), and the view that takes a person's action
from it: provide the result (a form drawn from the wait's schema by `approvals.forms`, as for a
question), retry the submit, or fail the wait with a reason. Every action goes through
`waits.people`, the same services and permission check as the admin and the API. The section
is shown on the job's page through `jobs.extensions.job_section`.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from approvals.forms import AnswerForm, JsonAnswerForm, answer_form_for
from approvals.policies import policy_describe
from approvals.rendering import details_html
from approvals.services import request_client_address
from jobs.errors import PlatformError
from jobs.models import Job
from jobs.pages import live_context, safe_next, visible_or_404
from waits.errors import InvalidResult, NotAllowedToAct
from waits.models import Wait
from waits.people import wait_check_can_act, wait_fail, wait_provide, wait_retry_submit

SECTION = "waits"


def result_form(wait: Wait, data: Any = None) -> AnswerForm:
    """The form for the result a person provides, drawn from the wait's schema as a question's
    answer form is (the forms read only `.schema`)."""
    return answer_form_for(wait, data, auto_id=f"w{wait.pk}_%s")


def act_refusal(wait: Wait, user: Any) -> str | None:
    """Why `user` may not act on `wait` now, in words; None when they may (the services check
    again when acting)."""
    try:
        wait_check_can_act(wait=wait, user=user)
    except NotAllowedToAct as exc:
        return exc.message
    if wait.job.status != Job.Status.WAITING:
        return (f"the job is {wait.job.status}: it is looking at the service's answer now; act again if it parks "
                "on this wait again")
    return None


def combined_wait_context(wait: Wait, user: Any, *, form: AnswerForm | None = None) -> dict[str, Any]:
    """What the job's page and the admin show of a combined wait, with the result form for a
    person who may act (or `form`, posted back with errors)."""
    refusal = act_refusal(wait, user)
    form = form or (result_form(wait) if refusal is None else None)
    return {
        "wait": wait,
        "prompt": wait.person.get("prompt", ""),
        "details_html": details_html(wait.person.get("details")),
        "assignees": ", ".join(wait.assignee_names()) or "superusers only",
        "then": policy_describe(wait.on_timeout) if wait.deadline_at else "",
        "not_allowed": refusal,
        "form": form,
        "schema_json": json.dumps(wait.schema, indent=2, sort_keys=True) if isinstance(form, JsonAnswerForm) else "",
    }


def combined_wait_section(
    request: HttpRequest, job: Job, *, next_url: str, posted: dict[Any, AnswerForm] | None = None,
) -> dict[str, Any] | None:
    """The active combined waits of `job` (at most one at a time, in practice), each with what a
    person may do about it; None (nothing shown) when there is none."""
    waits = (Wait.objects.filter(job=job, person__isnull=False, state__in=Wait.ACTIVE).select_related("job")
             .prefetch_related("assigned_users", "assigned_groups").order_by("created_at"))
    items = []
    for wait in waits:
        item = combined_wait_context(wait, request.user, form=(posted or {}).get(wait.pk))
        item["act_url"] = reverse("waits:wait-act", args=[job.pk, wait.pk])
        items.append(item)
    return {"combined_waits": items} if items else None


def act_from_post(request: HttpRequest, wait: Wait, *, via: str) -> tuple[str, str, AnswerForm | None]:
    """Do what the posted form asks (`_provide`, `_retry`, `_fail`) through `waits.people`.
    Returns (level, message, form): the form comes back only when the result had errors that
    its fields can show."""
    address = request_client_address(request)
    reason = (request.POST.get("reason") or "").strip()
    try:
        if "_retry" in request.POST:
            wait_retry_submit(wait_id=wait.pk, user=request.user, comment=reason, via=via, client_address=address)
            return "success", "The submit is retried: the job hands the work out again.", None
        if "_fail" in request.POST:
            wait_fail(wait_id=wait.pk, user=request.user, reason=reason, via=via, client_address=address)
            return "success", "The wait failed, and its job with it.", None
        form = result_form(wait, request.POST)
        if not form.is_valid():
            return "error", "The result was not recorded: correct what is marked below.", form
        try:
            wait_provide(wait_id=wait.pk, user=request.user, result=form.answer(), comment=form.comment(), via=via,
                         client_address=address)
        except InvalidResult as exc:
            form.add_answer_error(exc)
            return "error", f"The result was not recorded: {exc.message}", form
        return "success", "Result recorded: the job resumes with it.", None
    except PlatformError as exc:
        return "error", f"Nothing was done: {exc.message}", None


@login_required
@require_POST
def wait_act_view(request: HttpRequest, job_id: Any, wait_id: int) -> HttpResponse:
    """A person's action on a combined wait from the job's page (ledger `via` = `web`). A result
    form with errors comes back on the job's page with the errors next to their fields (400);
    anything else is a message on the page the form was on."""
    job = visible_or_404(request, job_id)
    back = safe_next(request, request.POST.get("next"), job)
    wait = Wait.objects.select_related("job").filter(job=job, pk=wait_id, person__isnull=False).first()
    if wait is None:
        raise Http404("no such wait on this job")
    level, message, form = act_from_post(request, wait, via="web")
    if form is None:
        getattr(messages, level)(request, message)
        return HttpResponseRedirect(back)
    context = live_context(request, job, next_url=back, posted={SECTION: {wait.pk: form}})
    return render(request, "jobs/job_detail.html", context, status=400)
