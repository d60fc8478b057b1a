"""The ASGI application: HTTP through Django, websockets through Channels.

Serve it with `uvicorn taskplatform.asgi:application` or `daphne taskplatform.asgi:application`.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.base")
# Sync views run in threads here: share a pool of PostgreSQL connections between them
# (see settings/base.py; no effect on SQLite). Set DATABASE_POOL=false to opt out.
os.environ.setdefault("DATABASE_POOL", "true")
# Django must be set up before anything imports models (the websocket routes do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from accounts.websocket import TicketAuthMiddleware, origin_checked  # noqa: E402
from jobs.wire import RawSendInScope  # noqa: E402
from taskplatform.logging import server_logs_redact  # noqa: E402
from taskplatform.routing import websocket_urlpatterns  # noqa: E402

# The ASGI server logs each request's path and query (uvicorn's access log, its websocket lines):
# wake tokens, tickets and any `token=` in them are written as [redacted].
server_logs_redact()

# Session cookie first, then `?ticket=` (which wins when given); a browser's Origin must be one
# of ALLOWED_HOSTS. The server's own `send` is kept in the scope for the live fan-out (jobs.wire).
application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": RawSendInScope(
            origin_checked(AuthMiddlewareStack(TicketAuthMiddleware(URLRouter(websocket_urlpatterns))))
        ),
    }
)
