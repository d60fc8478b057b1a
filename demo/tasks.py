"""Celery tasks of the simulated generation service (`demo.simulator`): only where `demo` is
installed (`make run`, `make test`), never under the production settings."""

from celery import shared_task

from demo import simulator
from jobs.periodic import PeriodicPassTask


@shared_task(name="demo.simulator_callbacks", base=PeriodicPassTask, ignore_result=True)
def simulator_callbacks() -> int:
    """Run by beat: the simulated service sends the callbacks that are due and not yet sent."""
    return simulator.callbacks_send_due()


@shared_task(name="demo.simulator_callback", ignore_result=True)
def simulator_callback(gen_id: str) -> bool:
    """The simulated service's callback for one generation, sent `delay` seconds after submit."""
    return simulator.callback_send_if_due(gen_id)
