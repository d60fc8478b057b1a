"""taskplatform: long-running background jobs with people in the loop."""

# Load the Celery app when Django starts so that `shared_task` binds to it.
from taskplatform.celery import app as celery_app

__all__ = ("celery_app",)
