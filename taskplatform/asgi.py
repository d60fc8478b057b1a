"""The ASGI application: HTTP through Django, websockets through Channels.

Serve it with `uvicorn taskplatform.asgi:application` or `daphne taskplatform.asgi:application`.
"""

import gc
import json
import os

from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskplatform.settings.production")
# Sync views run in threads here: share a pool of PostgreSQL connections between them
# (see settings/base.py; no effect on SQLite). Set DATABASE_POOL=false to opt out.
os.environ.setdefault("DATABASE_POOL", "true")
# Django must be set up before anything imports models (the websocket routes do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from accounts.websocket import TicketAuthMiddleware, origin_checked  # noqa: E402
from jobs.wire import RawSendInScope  # noqa: E402
from ops.logging import server_logs_redact  # noqa: E402
from taskplatform.heap import WEB_THRESHOLDS, freeze_startup_objects  # noqa: E402
from taskplatform.http import ThreadedWSGI, http_router  # noqa: E402
from taskplatform.routing import websocket_urlpatterns  # noqa: E402


def body_size_limited(app):
    """Answer 413 to a request that declares a body over REQUEST_BODY_MAX_BYTES, before reading it:
    Django's ASGI handler would otherwise spool the whole body to disk first."""
    from django.conf import settings

    async def limited(scope, receive, send):
        limit = settings.REQUEST_BODY_MAX_BYTES
        declared = next((value for name, value in scope.get("headers", ()) if name == b"content-length"), b"")
        if declared.isdigit() and int(declared) > limit:
            body = json.dumps({"code": "request_too_large",
                               "detail": f"the request body is larger than {limit} bytes; send less"}).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return limited


# The ASGI server logs each request's path and query (uvicorn's access log, its websocket lines):
# wake tokens, tickets and any `token=` in them are written as [redacted].
server_logs_redact()

# Session cookie first, then `?ticket=` (which wins when given); a browser's Origin must be one
# of ALLOWED_HOSTS. The server's own `send` is kept in the scope for the live fan-out (jobs.wire).
application = ProtocolTypeRouter(
    {
        # Sync views through the WSGI handler in threads (one hand-off per request); the SSE stream,
        # an async view, through Django's ASGI handler (taskplatform/http.py).
        "http": body_size_limited(http_router(
            ThreadedWSGI(get_wsgi_application(), threads=int(os.environ.get("WEB_THREADS", "8"))),
            django_asgi_app,
        )),
        "websocket": RawSendInScope(
            origin_checked(AuthMiddlewareStack(TicketAuthMiddleware(URLRouter(websocket_urlpatterns))))
        ),
    }
)


def load_what_the_first_requests_would() -> None:
    """Import and build now what the first requests would otherwise load one at a time: every
    URLconf with its views and DRF's, the session's serializer and the messages' storage,
    Celery's task registry and tasks module, its message builder and event dispatcher (a submit's
    or an answer's message), the authentication backends, the database backend's SQL compiler
    (PostgreSQL's backend imports it with itself, SQLite's at its first query), the channel
    layer's backend and the push thread, which connects to Redis in the background; Celery's
    result backend (none, but finding that out reads every installed package's entry points: a
    web process's first job message did it), and the fields of the API's serializers (each
    class's once, `jobs.serializers.FieldsBuiltOnce`: a process's first answer built the
    question's). The first
    `POST /api/jobs/` of a new web process took 200-230 ms, against 10-15 ms for the next ones,
    and the first answer of each web process was some 100 ms late importing the tasks module
    (bench/README.md); what they loaded stayed out of the freeze below. Nothing here connects to
    the broker."""
    from celery.events import dispatcher  # noqa: F401  (what a message's `sent` event would import)
    from django.conf import settings
    from django.contrib.auth import get_backends
    from django.db import connection
    from django.urls import get_resolver
    from django.utils.module_loading import import_string
    from rest_framework.settings import api_settings

    import jobs.tasks  # noqa: F401  (`job_dispatch` imports it when it sends the first message)
    from jobs.broadcast import publisher
    from jobs.serializers import FieldsBuiltOnce
    from taskplatform.celery import app

    get_resolver().url_patterns  # noqa: B018  (a cached property: it imports every URLconf)
    for name in ("DEFAULT_RENDERER_CLASSES", "DEFAULT_PARSER_CLASSES", "DEFAULT_AUTHENTICATION_CLASSES",
                 "DEFAULT_PERMISSION_CLASSES", "DEFAULT_THROTTLE_CLASSES", "DEFAULT_CONTENT_NEGOTIATION_CLASS"):
        getattr(api_settings, name)  # DRF imports its classes on first use
    get_backends()
    connection.ops.compiler("SQLCompiler")  # imports the backend's compiler module; connects to nothing
    import_string(settings.SESSION_SERIALIZER)
    if "django.contrib.messages" in settings.INSTALLED_APPS:
        import_string(settings.MESSAGE_STORAGE)
    app.finalize(auto=True)
    app.amqp  # noqa: B018  (a cached property: the message builder, its routes and queues)
    app.amqp.router  # noqa: B018
    app.events  # noqa: B018
    app.backend  # noqa: B018  (a cached property)
    classes = [FieldsBuiltOnce]  # every one the URLconfs imported, and theirs
    while classes:
        for serializer in classes.pop().__subclasses__():
            classes.append(serializer)
            serializer().fields  # noqa: B018
    publisher()


load_what_the_first_requests_would()

# Everything imported and built so far stays: out of the garbage collector's full passes
# (taskplatform/heap.py), which otherwise held every request in flight for a fifth of a second.
freeze_startup_objects()
gc.set_threshold(*WEB_THRESHOLDS)
