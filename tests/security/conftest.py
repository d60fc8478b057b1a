"""The security suite reuses the live tests' ASGI server."""

from tests.live.conftest import live_asgi, server  # noqa: F401  (fixtures)
