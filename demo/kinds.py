"""The example job kinds of the contract, always registered where `demo` is installed.

`demo.noop` and `demo.sleep` declare their input as a JSON Schema; the others are typed: their
input, result and answers are pydantic models, and their schemas (in the API, OpenAPI and the
admin) are derived from them. Tests written with `jobs.testing` for each: tests/demo/.
"""

from __future__ import annotations

import time
from enum import StrEnum

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field

from approvals.policies import Default
from approvals.schemas import Approval, ApprovalWithReason, choice
from demo.services import step_run_count, step_runs
from jobs.registry import job_kind
from jobs.runtime import JobContext
from waits.gateway import service_request
from waits.policy import CheckResult, Person


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


# -- demo.review -------------------------------------------------------------------------------
class ReviewInput(BaseModel):
    """A document to review, and how: a quorum, a deadline, how long an approval stays valid."""

    model_config = ConfigDict(extra="forbid")

    document: str = Field(max_length=100_000)
    required_approvals: int = Field(default=1, ge=1, le=5, description="Distinct reviewers who must approve.")
    timeout: float | None = Field(default=None, gt=0, description="Seconds until the deadline (then the job fails).")
    valid_for: float | None = Field(default=None, gt=0, description="Seconds an approval stays usable.")


class ReviewResult(BaseModel):
    approved: bool
    reviewer: str = Field(description="Who decided (with a quorum, the last approver).")


# The tour signs in as `admin`, submits a review and approves it: a demo may approve itself.
@job_kind("demo.review", allow_self_approval=True)
def review(ctx: JobContext, input: ReviewInput) -> ReviewResult:
    """Asks the group `reviewers` to approve a document: `required_approvals` of them (default 1),
    before `timeout` seconds (default: no deadline; then the job fails), an approval counting
    for `valid_for` seconds (default: no limit)."""
    answer = ctx.ask("approve", "Approve this document?", answer=Approval, details={"document": input.document},
                     required_approvals=input.required_approvals, timeout=input.timeout, valid_for=input.valid_for)
    question = ctx.question("approve")
    return ReviewResult(approved=answer.approved,
                        reviewer=question.answered_by.get_username() if question.answered_by else "system")


# -- demo.expense ------------------------------------------------------------------------------
class Budget(StrEnum):
    TRAVEL = "travel"
    EQUIPMENT = "equipment"
    TRAINING = "training"
    OTHER = "other"


BUDGET_LABELS = {Budget.TRAVEL: "Travel", Budget.EQUIPMENT: "Equipment", Budget.TRAINING: "Training",
                 Budget.OTHER: "Other"}
EXPENSE_CATEGORIES = {budget.value: label for budget, label in BUDGET_LABELS.items()}


class ExpenseInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    employee: str = Field(min_length=1, max_length=200)
    amount: float = Field(gt=0)
    currency: str = Field(default="EUR", min_length=3, max_length=3)
    description: str = Field(max_length=2000)
    approvals: int = Field(default=2, ge=1, le=5, description="Distinct reviewers who must approve.")
    deadline_seconds: float | None = Field(default=None, gt=0, description="Then the claim is rejected.")


class ReceiptCheck(BaseModel):
    """The reviewer's check of the receipt: a form, one field per property."""

    model_config = ConfigDict(extra="forbid")

    amount: float = Field(gt=0, title="Amount on the receipt")
    vat: float | None = Field(default=None, ge=0, title="VAT included")
    receipt_attached: bool = Field(title="The receipt is attached and readable")
    note: str | None = Field(default=None, max_length=500, description="Anything the approvers should know.")


class ExpenseResult(BaseModel):
    approved: bool
    category: Budget
    approvers: list[str] | None = None
    paid: float | None = None
    currency: str | None = None
    reason: str | None = None
    rejected_by: str | None = None


@job_kind("demo.expense")
def expense(ctx: JobContext, input: ExpenseInput) -> ExpenseResult:
    """An expense claim: a reviewer picks the budget (a choice), checks the amounts (a form), then
    `approvals` (default 2) reviewers approve it (a quorum); any rejection, with its reason, ends it."""
    claim = {"employee": input.employee, "amount": f"{input.amount:.2f} {input.currency}",
             "description": input.description}
    category = ctx.ask("category", "Which budget does this expense come from?",
                       schema=choice(EXPENSE_CATEGORIES), answer=Budget, details=claim)
    budget = {**claim, "budget": BUDGET_LABELS[category]}
    checked = ctx.ask("check", "Check the claim against the receipt and correct the amounts if needed.",
                      answer=ReceiptCheck, details=budget)
    deadline = input.deadline_seconds
    decision = ctx.ask(
        "approve",
        f"Approve {checked.amount:.2f} {input.currency} for {input.employee}?",
        answer=ApprovalWithReason,
        details={**budget, "checked": checked},
        required_approvals=input.approvals,
        timeout=deadline,
        on_timeout=Default({"approved": False, "reason": "no decision before the deadline"}) if deadline else None,
    )
    question = ctx.question("approve")
    if not decision.approved:
        return ExpenseResult(approved=False, reason=decision.reason, category=category,
                             rejected_by=question.answered_by.get_username() if question.answered_by else "system")
    payment = ctx.step("pay", lambda: {"paid": checked.amount, "currency": input.currency})
    return ExpenseResult(approved=True, category=category, approvers=question.approvers(), **payment)


# -- demo.generate -----------------------------------------------------------------------------
class GenerateInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(max_length=10_000)
    delay: float = Field(ge=0, le=86400, description="Seconds the simulated service takes.")
    drop_callback: bool = Field(default=False, description="The service never calls back (a backup check finds it).")
    throttle: int = Field(default=0, ge=0, le=1000, description="The service's first N calls answer 429.")
    stand_in: bool = Field(default=False, description="A reviewer may stand in for a lost callback.")
    timeout: float | None = Field(default=None, gt=0,
                                  description="With stand_in: seconds until the wait fails (default: none).")


class Generation(BaseModel):
    text: str


# What a reviewer standing in for the service writes (`stand_in`): a Generation.
GENERATED_TEXT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 100_000, "title": "The text"}},
    "required": ["text"],
    "additionalProperties": False,
}


def generation_submit(input: GenerateInput | dict, token: str, callback_url: str | None) -> str:
    """Hand the prompt to the simulated generation service; the token is the idempotency key."""
    data = input.model_dump(exclude_unset=True) if isinstance(input, GenerateInput) else input
    body = {key: data[key] for key in ("prompt", "delay", "drop_callback", "throttle") if key in data}
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
        return CheckResult.succeeded(Generation(text=answer["text"]))
    return CheckResult.pending(progress=answer.get("progress"), text="generating")


@job_kind("demo.generate")
def generate(ctx: JobContext, input: GenerateInput) -> Generation:
    """Submits a prompt to the bundled simulated generation service and parks until it is done.
    With `stand_in`, a reviewer may also end the wait (write the text, retry the submit, or fail
    it), whichever comes first, within `timeout` seconds when given."""
    person = None
    if input.stand_in:
        person = Person(
            "The generation service may have lost this job: write the text yourself, retry the submit, or fail it.",
            schema=GENERATED_TEXT_SCHEMA, details={"prompt": input.prompt},
        )
    return ctx.wait_for(
        "generate",
        submit=lambda token, callback_url: generation_submit(input, token, callback_url),
        check=generation_check,
        service="simulated generation",
        person=person,
        timeout=input.timeout if person else None,
        result=Generation,
    )


# -- demo.batch_review -------------------------------------------------------------------------
class BatchReviewInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[str] = Field(min_length=1, max_length=500)


class BatchReviewResult(BaseModel):
    approved: list[int] = Field(description="The indexes of the approved documents.")
    rejected: list[int] = Field(description="The indexes of the rejected documents.")


@job_kind("demo.batch_review")
def batch_review(ctx: JobContext, input: BatchReviewInput) -> BatchReviewResult:
    """Spawns one `demo.review` child per document and parks, holding no worker, until every
    review has ended."""
    reviews = ctx.map("demo.review", [ReviewInput(document=document) for document in input.documents], key="review")
    results: list[ReviewResult] = ctx.gather(reviews)
    return BatchReviewResult(approved=[index for index, result in enumerate(results) if result.approved],
                             rejected=[index for index, result in enumerate(results) if not result.approved])
