"""Settings for `make test`: the development settings with faster password hashing."""

import uuid as _uuid

from taskplatform.settings.development import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Short back-off so retry tests do not sleep.
JOBS_RETRY_BACKOFF_BASE = env.float("JOBS_RETRY_BACKOFF_BASE", default=0.05)  # noqa: F405
JOBS_RETRY_BACKOFF_MAX = env.float("JOBS_RETRY_BACKOFF_MAX", default=0.2)  # noqa: F405


# Every test run gets its own Redis key prefix (queues, channel groups), so runs that share a
# Redis server never see each other's messages. Worker processes started by the tests are
# handed the same prefix explicitly.
REDIS_KEY_PREFIX = env.str("REDIS_KEY_PREFIX", default=f"test-{_uuid.uuid4().hex[:8]}:")  # noqa: F405
CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS, "global_keyprefix": REDIS_KEY_PREFIX}  # noqa: F405
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = f"{REDIS_KEY_PREFIX}asgi"  # noqa: F405

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testkinds", "tests.waitkinds", "tests.prodkinds"]  # noqa: F405
CACHES["default"]["KEY_PREFIX"] = REDIS_KEY_PREFIX  # noqa: F405
# Every reuse of a kept move statement is compared with the ORM's (jobs/statements.py).
JOBS_CHECK_MOVE_STATEMENTS = True
KEPT_READS_CHECK = True
