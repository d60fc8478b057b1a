"""A bare Django + Celery process's start: the substrate's part of `manage.py submit`'s.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python bench/bare_start.py

`bench/shipped.py` (its `start` phase) times this process beside `manage.py submit demo.noop
--count 1` under `make run`'s settings, from spawn to exit. This one does what any process on
the same substrate must do before it can submit a job: Python starts, Django is set up with only
`contenttypes` and `auth` on PostgreSQL, a Celery app with the Redis broker is made (its import is
most of Celery's start), one statement goes to PostgreSQL and one message to Redis. Nothing of the
platform is imported. The message goes to the queue named by `BARE_START_QUEUE` (default
`bench-start`), which no worker reads; the bench deletes it.

The difference between the two is what the platform's own modules, its apps and its kinds add
to every process's start; the rest is the substrate's.
"""

from __future__ import annotations

import os

import django
import environ
from celery import Celery
from django.conf import settings

QUEUE = os.environ.get("BARE_START_QUEUE", "bench-start")


def main() -> None:
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
        DATABASES={"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])},
        USE_TZ=True,
    )
    app = Celery("bare-start", broker=os.environ["REDIS_URL"], set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True)
    django.setup()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    app.send_task("bench.start", args=[], queue=QUEUE)


if __name__ == "__main__":
    main()
