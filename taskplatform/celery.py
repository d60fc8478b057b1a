"""The Celery app: `celery -A taskplatform worker|beat|flower`."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.base")

app = Celery("taskplatform")
# Every CELERY_* setting in Django's settings configures Celery (see settings/base.py).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.task_prerun.connect
@signals.task_postrun.connect
def _close_old_connections(**kwargs) -> None:
    # With CELERY_DB_REUSE_MAX the fix-up keeps connections; do what Django does around a
    # request instead: drop a connection that broke or outlived CONN_MAX_AGE.
    from django.db import close_old_connections

    close_old_connections()
