from django.apps import AppConfig


class TestKindsConfig(AppConfig):
    """Job kinds used only by the tests (installed by taskplatform.settings.test)."""

    name = "tests.testkinds"
    label = "testkinds"
