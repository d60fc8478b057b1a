"""The Celery app: `celery -A taskplatform worker|beat|flower`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.base")

app = Celery("taskplatform")
# Every CELERY_* setting in Django's settings configures Celery (see settings/base.py).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
