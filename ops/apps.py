from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operations: metrics, readiness, the staff dashboard."""

    name = "ops"
    default_auto_field = "django.db.models.BigAutoField"
