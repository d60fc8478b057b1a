"""The example job kinds of the contract, always registered."""

import time

from approvals.schemas import APPROVAL_SCHEMA
from demo.services import step_run_count, step_runs
from jobs.registry import job_kind


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
    input_schema={
        "type": "object",
        "properties": {"document": {"type": "string"}},
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
