"""Plain Django views of the jobs app."""

from django.db import connection
from django.http import JsonResponse

from jobs.redis_clients import redis_client


def healthz(request):
    """200 when the database and Redis answer, 503 naming the one that does not."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure to reach the database is a failed check
        checks["database"] = f"error: {type(exc).__name__}: {exc}"
    try:
        client = redis_client(socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}: {exc}"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if healthy else "unavailable", **checks}, status=200 if healthy else 503)
