from django.apps import AppConfig


class WaitsConfig(AppConfig):
    """Jobs parked on slow external work: waits, wake tokens, backup checks."""

    name = "waits"
    verbose_name = "Waits on external work"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from waits.extensions import register

        register()
