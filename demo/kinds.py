"""The example job kinds of the contract, always registered."""

import time

from django.conf import settings

from approvals.policies import Default
from approvals.schemas import APPROVAL_SCHEMA, approval, choice, form
from demo.services import step_run_count, step_runs
from jobs.registry import job_kind
from waits.gateway import service_request
from waits.policy import CheckResult


@job_kind("demo.noop", input_schema={"type": "object", "additionalProperties": False})
def noop(ctx, input):
    """Does nothing; for measuring the platform's own cost."""
    return {}


@job_kind(
    "demo.sleep",
    input_schema={
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "minimum": 0, "maximum": 3600},
            "steps": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        "required": ["seconds", "steps"],
        "additionalProperties": False,
    },
)
def sleep(ctx, input):
    """Sleeps `seconds` in `steps` checkpointed steps, reporting progress after each."""
    seconds, steps = input["seconds"], input["steps"]

    for number in range(1, steps + 1):
        name = str(number)

        def body(name=name):
            step_run_count(job_id=ctx.job_id, step=name)
            time.sleep(seconds / steps)
            return {"step": int(name)}

        ctx.step(name, body)
        ctx.progress(number / steps, f"step {number} of {steps}")
    return {"slept": seconds, "step_runs": step_runs(job_id=ctx.job_id)}


@job_kind(
    "demo.review",
    # The tour signs in as `admin`, submits a review and approves it: a demo may approve itself.
    allow_self_approval=True,
    input_schema={
        "type": "object",
        "properties": {"document": {"type": "string", "maxLength": 100_000}},
        "required": ["document"],
        "additionalProperties": False,
    },
)
def review(ctx, input):
    """Asks a reviewer to approve a document."""
    answer = ctx.ask(
        "approve",
        "Approve this document?",
        schema=APPROVAL_SCHEMA,
        details={"document": input["document"]},
    )
    question = ctx.question("approve")
    return {"approved": answer["approved"], "reviewer": question.answered_by.get_username()}


EXPENSE_CATEGORIES = {"travel": "Travel", "equipment": "Equipment", "training": "Training", "other": "Other"}


@job_kind(
    "demo.expense",
    input_schema={
        "type": "object",
        "properties": {
            "employee": {"type": "string", "minLength": 1, "maxLength": 200},
            "amount": {"type": "number", "exclusiveMinimum": 0},
            "currency": {"type": "string", "minLength": 3, "maxLength": 3},
            "description": {"type": "string", "maxLength": 2000},
            "approvals": {"type": "integer", "minimum": 1, "maximum": 5},
            "deadline_seconds": {"type": "number", "exclusiveMinimum": 0},
        },
        "required": ["employee", "amount", "description"],
        "additionalProperties": False,
    },
)
def expense(ctx, input):
    """An expense claim: a reviewer picks the budget (a choice), checks the amounts (a form), then
    `approvals` (default 2) reviewers approve it (a quorum); any rejection, with its reason, ends it."""
    currency = input.get("currency", "EUR")
    claim = {"employee": input["employee"], "amount": f"{input['amount']:.2f} {currency}",
             "description": input["description"]}
    category = ctx.ask("category", "Which budget does this expense come from?",
                       schema=choice(EXPENSE_CATEGORIES), details=claim)
    checked = ctx.ask(
        "check",
        "Check the claim against the receipt and correct the amounts if needed.",
        schema=form({
            "type": "object",
            "properties": {
                "amount": {"type": "number", "exclusiveMinimum": 0, "title": "Amount on the receipt"},
                "vat": {"type": "number", "minimum": 0, "title": "VAT included"},
                "receipt_attached": {"type": "boolean", "title": "The receipt is attached and readable"},
                "note": {"type": "string", "maxLength": 500, "description": "Anything the approvers should know."},
            },
            "required": ["amount", "receipt_attached"],
            "additionalProperties": False,
        }),
        details={**claim, "budget": EXPENSE_CATEGORIES[category]},
    )
    deadline = input.get("deadline_seconds")
    decision = ctx.ask(
        "approve",
        f"Approve {checked['amount']:.2f} {currency} for {input['employee']}?",
        schema=approval(),
        details={**claim, "budget": EXPENSE_CATEGORIES[category], "checked": checked},
        required_approvals=input.get("approvals", 2),
        timeout=deadline,
        on_timeout=Default({"approved": False, "reason": "no decision before the deadline"}) if deadline else None,
    )
    question = ctx.question("approve")
    if not decision["approved"]:
        return {"approved": False, "reason": decision.get("reason"), "category": category,
                "rejected_by": question.answered_by.get_username() if question.answered_by else "system"}
    payment = ctx.step("pay", lambda: {"paid": checked["amount"], "currency": currency})
    return {"approved": True, "category": category, "approvers": question.approvers(), **payment}


def generation_submit(input: dict, token: str, callback_url: str | None) -> str:
    """Hand the prompt to the simulated generation service; the token is the idempotency key."""
    body = {key: input[key] for key in ("prompt", "delay", "drop_callback", "throttle") if key in input}
    _, answer = service_request(
        "POST", f"{settings.PUBLIC_URL}/sim/generate/", json={**body, "callback_url": callback_url},
        headers={"Idempotency-Key": token},
    )
    return answer["id"]


def generation_check(external_id: str) -> CheckResult:
    """Ask the simulated service how the generation is doing."""
    status, answer = service_request("GET", f"{settings.PUBLIC_URL}/sim/generate/{external_id}/")
    if status == 404:
        return CheckResult.failed("the service does not know this generation")
    if answer.get("status") == "succeeded":
        return CheckResult.succeeded({"text": answer["text"]})
    return CheckResult.pending(progress=answer.get("progress"), text="generating")


@job_kind(
    "demo.generate",
    input_schema={
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "maxLength": 10_000},
            "delay": {"type": "number", "minimum": 0, "maximum": 86400},
            "drop_callback": {"type": "boolean"},
            "throttle": {"type": "integer", "minimum": 0, "maximum": 1000},
        },
        "required": ["prompt", "delay"],
        "additionalProperties": False,
    },
)
def generate(ctx, input):
    """Submits a prompt to the bundled simulated generation service and parks until it is done."""
    result = ctx.wait_for(
        "generate",
        submit=lambda token, callback_url: generation_submit(input, token, callback_url),
        check=generation_check,
        service="simulated generation",
    )
    return {"text": result["text"]}
