"""What approvals plugs into the jobs core (`jobs.extensions`), registered once at start-up by
`ApprovalsConfig.ready()`: `ctx.ask` and `ctx.question`, the closing of a cancelled job's
questions, a reviewer's view of the jobs they are asked about, the questions on a job's page,
the decision ledger on its admin page, and the answering of questions in `jobs.testing`."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef

from jobs import extensions
from jobs.models import Job


def register() -> None:
    from approvals import pages, runtime
    from approvals.admin.decisions import JobDecisionInline
    from approvals.selectors import questions_answerable_by
    from approvals.services import questions_cancel_for_job

    extensions.context_method("ask")(runtime.ask)
    extensions.context_method("question")(runtime.question)

    @extensions.transition_hook("approvals.close-questions", statuses=Job.TERMINAL, before=True)
    def close_questions(*, job: Job, to: str, actor: Any, channel: str | None) -> None:
        comment = "the job was cancelled" if to == Job.Status.CANCELLED else f"the job ended ({to})"
        questions_cancel_for_job(job=job, actor=actor, channel=channel, comment=comment)

    @extensions.visibility_rule("approvals.answerable")
    def answerable(user: Any, *, per_row: bool) -> Any:
        return Exists(questions_answerable_by(user, per_row=per_row).filter(job_id=OuterRef("pk")))

    extensions.job_section(pages.SECTION, template="approvals/_job_questions.html", order=10)(
        pages.open_questions_section
    )
    extensions.job_admin_inline(JobDecisionInline, order=10)

    extensions.harness_driver("approvals.answer", status=Job.Status.PAUSED,
                              resume="approvals.testing.answer_paused_job")
