"""The production settings as a deployment has them, plus a kind of the deployment's own
(`tests.prodkinds`): what a test of a production process runs."""

from taskplatform.settings.production import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.prodkinds"]  # noqa: F405
