"""The settings' reader of the environment: django-environ's, refusing what it would misread.

django-environ turns any text it does not know as true into False (`DJANGO_SECURE_COOKIES=ture`
would turn secure cookies off), reads a number by dropping what is not a digit
(`JOBS_LEASE_SECONDS=1.2.3` was 12.3 seconds, `60s` was 60), and a number it cannot read at all
into a `ValueError` that names neither the variable nor its value. Here a value that is not one
of the known spellings, or not a number where a number is wanted, stops the process with one line
that names the variable and what it takes: a setting that fails closed, in every entry point
(manage.py, the ASGI server, Celery), as `taskplatform.settings.production` refuses a missing
signing key.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import environ

TRUE_WORDS = frozenset({"true", "on", "ok", "y", "yes", "1"})  # django-environ's own
FALSE_WORDS = frozenset({"false", "off", "n", "no", "0", ""})

_EXPECTED = {
    bool: f"true or false ({', '.join(sorted(TRUE_WORDS))}; {', '.join(sorted(w for w in FALSE_WORDS if w))})",
    int: "a whole number",
    float: "a number (such as 2, 0.5 or 1e3)",
}


def refuse(reason: str, *, settings: str = "") -> NoReturn:
    """Stop the process with `reason`, one line, no traceback (SystemExit, not ImproperlyConfigured:
    every entry point then prints just this). `settings`: which settings refuse it, when only some do."""
    raise SystemExit(f"taskplatform refuses to start{f' with {settings}' if settings else ''}: {reason}")


class SettingsEnv(environ.Env):
    """`environ.Env` whose values are read strictly (see the module's docstring)."""

    @classmethod
    def parse_value(cls, value: Any, cast: Any) -> Any:
        if cast is bool and isinstance(value, str):
            word = value.strip().lower()
            if word in TRUE_WORDS:
                return True
            if word in FALSE_WORDS:
                return False
            raise ValueError(f"{value!r} is neither true nor false")
        if cast is float and isinstance(value, str):
            number = float(value.strip())  # Python's own reading: "1.2.3" and "60s" are refused
            if not math.isfinite(number):
                raise ValueError(f"{value!r} is not finite")
            return number
        return super().parse_value(value, cast)

    def get_value(self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET,
                  parse_default: bool = False) -> Any:
        try:
            return super().get_value(var, cast=cast, default=default, parse_default=parse_default)
        except (ValueError, TypeError) as exc:
            raw = self.ENVIRON.get(f"{self.prefix}{var}")
            expected = _EXPECTED.get(cast, f"a valid value ({exc})")
            refuse(f"{var}={raw!r} is not {expected}")

    def count(self, var: str, *, default: int, minimum: int = 0) -> int:
        """A whole number of at least `minimum` (a count, a size, a limit where 0 means none)."""
        value = self.int(var, default=default)
        if value < minimum:
            refuse(f"{var}={value} is less than {minimum}")
        return value
