"""The job kinds a deployment brings itself (the production settings install no demo kinds)."""

from jobs.registry import job_kind


@job_kind("prod.noop", input_schema={"type": "object"})
def noop(ctx, input):
    """Does nothing."""
    return {}
