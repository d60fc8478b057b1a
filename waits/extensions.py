"""What waits plugs into the jobs core (`jobs.extensions`), registered once at start-up by
`WaitsConfig.ready()`: `ctx.wait_for`, the closing of a cancelled job's waits, a person's view of
the jobs whose combined wait they may end, that wait's actions on the job's page, the waits on
the job's admin page, and a double of the outside service for `jobs.testing`."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef

from jobs import extensions
from jobs.models import Job


def register() -> None:
    from waits import pages
    from waits.admin import WaitInline
    from waits.runtime import wait_for
    from waits.selectors import waits_actable_by
    from waits.services import waits_cancel_for_job

    extensions.context_method("wait_for")(wait_for)

    @extensions.transition_hook("waits.close-waits", statuses=Job.TERMINAL, before=True)
    def close_waits(*, job: Job, to: str, actor: Any, channel: str | None) -> None:
        waits_cancel_for_job(job=job, actor=actor, to=to)

    @extensions.visibility_rule("waits.may-act")
    def may_act(user: Any, *, per_row: bool) -> Any:
        return Exists(waits_actable_by(user, per_row=per_row).filter(job_id=OuterRef("pk")))

    extensions.job_section(pages.SECTION, template="waits/_job_wait.html", order=20)(pages.combined_wait_section)
    extensions.job_admin_inline(WaitInline, order=20)

    extensions.harness_driver("waits.service", status=Job.Status.WAITING, resume="waits.testing.resume_waiting_job",
                              prepare="waits.testing.install_service_doubles")
