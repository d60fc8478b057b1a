"""Production settings, the default of every entry point (manage.py, the ASGI application, the
Celery app): the base settings with HTTPS hardening, and a refusal to start without a real
signing key. Each hardening setting comes from the environment with the safe default
(`.env.example`, the README's "Security" section)."""

import copy

from taskplatform.settings.base import *  # noqa: F403
from taskplatform.settings.development import DEVELOPMENT_SECRET_KEY
from taskplatform.settings.environment import refuse

DEBUG = env.bool("DJANGO_DEBUG", default=False)  # noqa: F405
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")  # noqa: F405
if not SECRET_KEY:
    # One line, no traceback, in every entry point (manage.py, uvicorn, daphne, celery).
    refuse("DJANGO_SECRET_KEY is not set (use a long random string, e.g. "
           "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`)", settings="the production settings")
if SECRET_KEY == DEVELOPMENT_SECRET_KEY:
    refuse("DJANGO_SECRET_KEY is the development key, which anyone can read in the source",
           settings="the production settings")
WHITENOISE_USE_FINDERS = False
WHITENOISE_AUTOREFRESH = False

# --- HTTPS (TLS ends at the proxy in front; see the README's "Security" section) ----------------
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=True)  # noqa: F405
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# Plain-HTTP requests are redirected to HTTPS, except the probes of a load balancer or an
# orchestrator, which talk to the process directly.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)  # noqa: F405
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
# Browsers remember to use HTTPS only (sent on HTTPS responses only). A year, subdomains
# included; lower it while trying HTTPS out. Preloading is a commitment an operator makes for
# their domain (hstspreload.org), so it is off unless asked for.
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31536000)  # noqa: F405
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)  # noqa: F405
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=False)  # noqa: F405
if not SECURE_HSTS_PRELOAD:
    # `check --deploy` warns about preload alone: that choice is the operator's, made above.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]
# The header the TLS proxy sets to "https" (e.g. X-Forwarded-Proto). Only when the proxy always
# sets or overwrites it: a client could send it otherwise. Unset: no header is trusted.
_proxy_ssl_header = env.str("DJANGO_SECURE_PROXY_SSL_HEADER", default="").strip()  # noqa: F405
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)

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
