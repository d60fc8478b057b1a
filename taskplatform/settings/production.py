"""Production settings: the base settings with safe defaults that development relaxes."""

import copy

from taskplatform.settings.base import *  # noqa: F403

DEBUG = env.bool("DJANGO_DEBUG", default=False)  # noqa: F405
SECRET_KEY = env.str("DJANGO_SECRET_KEY")  # noqa: F405  (required: no default in production)
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=True)  # noqa: F405
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
WHITENOISE_USE_FINDERS = False

# No demo or development code in production: the example kinds and the simulated generation
# service (an unauthenticated outside system's stand-in) are neither installed nor routed.
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "demo"]  # noqa: F405
CELERY_BEAT_SCHEDULE = {  # noqa: F405
    name: entry for name, entry in CELERY_BEAT_SCHEDULE.items() if not entry["task"].startswith("demo.")  # noqa: F405
}

# One JSON object a line (a log collector parses them; `job_id` and `job_kind` are fields). The
# ASGI server's own loggers write through the same handler, so every line of the web process is
# JSON too (uvicorn configures them before Django starts; this runs after and takes them over).
LOG_FORMAT = env.str("LOG_FORMAT", default="json")  # noqa: F405
LOGGING = copy.deepcopy(LOGGING)  # noqa: F405  (a copy: the base module's dict stays as it was)
LOGGING["handlers"]["console"]["formatter"] = LOG_FORMAT
LOGGING["loggers"].update({
    name: {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False}  # noqa: F405
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "daphne")
})
