"""taskplatform: long-running background jobs with people in the loop."""

# The first of the platform's modules that every process imports (its settings, the Celery app,
# the ASGI application): the garbage collector waits until the process has loaded (heap.py).
from taskplatform import heap

heap.loading()

# Load the Celery app when Django starts so that `shared_task` binds to it.
from taskplatform.celery import app as celery_app  # noqa: E402

__all__ = ("celery_app",)
