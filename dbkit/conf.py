"""Settings read on every statement and every move of a job, at the cost of a dict lookup.

`django.conf.settings.NAME` goes through `LazyObject.__getattribute__` at every read, which also
asks the value for `_mask_wrapped` (for a bool or a number, an AttributeError raised and caught):
0.28 µs a read in a hot loop, and a job's run read its settings 14 times (bench/README.md, "The
bench's own windows"). `LazySettings` already keeps each setting it has read in its instance's
`__dict__`, and takes it out when the setting changes (`override_settings`, pytest-django's
`settings` fixture and a plain assignment all go through its `__setattr__`, which drops that
name, or every name when the settings object is swapped). `setting` reads that dict directly;
what is not in it yet is read the usual way, which puts it there.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

# The very dict `LazySettings` keeps its read settings in: cleared in place, never replaced.
_read = object.__getattribute__(settings, "__dict__")
_NO_DEFAULT = object()


def setting(name: str, default: Any = _NO_DEFAULT) -> Any:
    """`settings.<name>` (or `getattr(settings, name, default)`), as Django reads it now."""
    try:
        return _read[name]
    except KeyError:
        return getattr(settings, name) if default is _NO_DEFAULT else getattr(settings, name, default)
