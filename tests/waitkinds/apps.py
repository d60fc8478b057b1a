from django.apps import AppConfig


class WaitKindsConfig(AppConfig):
    """The `test.wait` job kind (installed by taskplatform.settings.test)."""

    name = "tests.waitkinds"
    label = "waitkinds"
