"""Celery tasks of the waits: thin, call a service."""

from celery import shared_task

from waits import simulator
from waits.services import waits_resume_due


@shared_task(name="waits.due", ignore_result=True)
def waits_due() -> int:
    """Run by beat every WAITS_DUE_INTERVAL seconds: resume the jobs whose wait is due (a backup
    mark, a poll, the end of a Retry-After or of a transport back-off)."""
    return waits_resume_due()


@shared_task(name="waits.simulator_callbacks", ignore_result=True)
def simulator_callbacks() -> int:
    """Run by beat: the simulated service sends the callbacks that are due and not yet sent."""
    return simulator.callbacks_send_due()


@shared_task(name="waits.simulator_callback", ignore_result=True)
def simulator_callback(gen_id: str) -> bool:
    """The simulated service's callback for one generation, sent `delay` seconds after submit."""
    return simulator.callback_send_if_due(gen_id)
