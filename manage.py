#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.production")
    # Collections wait until the apps are ready, from here rather than from the settings' import
    # (taskplatform/heap.py): Django's management modules load first.
    from taskplatform import heap

    heap.loading()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
