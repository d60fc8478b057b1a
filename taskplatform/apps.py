"""The project as an installed app, last in INSTALLED_APPS: Django runs the apps' `ready()` in that
order, so this one runs when the process has loaded every app."""

from django.apps import AppConfig


class TaskplatformConfig(AppConfig):
    name = "taskplatform"
    verbose_name = "taskplatform"

    def ready(self) -> None:
        # What the process loaded is frozen and the garbage collector goes back on (heap.py).
        from taskplatform.heap import loaded

        loaded()
