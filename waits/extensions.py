"""What waits plugs into the jobs core (`jobs.extensions`), registered once at start-up by
`WaitsConfig.ready()`: `ctx.wait_for`, the closing of a cancelled job's waits, and the waits on
the job's admin page."""

from __future__ import annotations

from typing import Any

from jobs import extensions
from jobs.models import Job


def register() -> None:
    from waits.admin import WaitInline
    from waits.runtime import wait_for
    from waits.services import waits_cancel_for_job

    extensions.context_method("wait_for")(wait_for)

    @extensions.transition_hook("waits.close-waits", statuses=Job.TERMINAL, before=True)
    def close_waits(*, job: Job, to: str, actor: Any, channel: str | None) -> None:
        waits_cancel_for_job(job=job, actor=actor, to=to)

    extensions.job_admin_inline(WaitInline, order=20)
