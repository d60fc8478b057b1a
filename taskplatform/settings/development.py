"""Development settings (`make run`): the base settings with debug pages, a fixed signing key
that anyone can read (so never for a server), and static files re-read as they change."""

from taskplatform.settings.base import *  # noqa: F403

# Known to everyone who has the source: the production settings refuse it.
DEVELOPMENT_SECRET_KEY = "insecure-development-key-change-me-in-production-0123456789"

DEBUG = env.bool("DJANGO_DEBUG", default=True)  # noqa: F405
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEVELOPMENT_SECRET_KEY)  # noqa: F405
WHITENOISE_AUTOREFRESH = DEBUG
