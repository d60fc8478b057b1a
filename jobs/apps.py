from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every app's `kinds` module registers its job kinds (like admin.autodiscover).
        autodiscover_modules("kinds")
