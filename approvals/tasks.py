"""Celery tasks of approvals: thin, take an id, call a service. A task is named for the pass or the
attempt it makes, never the same as the service it calls."""

from celery import shared_task

from approvals.services import question_notify, questions_expire_due
from jobs.periodic import PeriodicPassTask


@shared_task(name="approvals.enforce_deadlines", base=PeriodicPassTask, ignore_result=True)
def questions_enforce_deadlines() -> int:
    """Run by beat every APPROVALS_DEADLINE_INTERVAL seconds: apply the `on_timeout` policy of
    each open question past its deadline."""
    return questions_expire_due()


@shared_task(name="approvals.notify", ignore_result=True)
def question_notification_send(question_id: str, action: str = "open") -> int:
    """E-mail the assignees of a question that opened or was escalated to them."""
    return question_notify(question_id=question_id, action=action)
