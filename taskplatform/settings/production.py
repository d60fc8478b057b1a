"""Production settings: the base settings with safe defaults that development relaxes."""

from taskplatform.settings.base import *  # noqa: F403

DEBUG = env.bool("DJANGO_DEBUG", default=False)  # noqa: F405
SECRET_KEY = env.str("DJANGO_SECRET_KEY")  # noqa: F405  (required: no default in production)
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=True)  # noqa: F405
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
WHITENOISE_USE_FINDERS = False
