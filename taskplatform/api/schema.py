"""Additions to the generated OpenAPI document for what is not a DRF view."""

from __future__ import annotations

from typing import Any

HEALTH_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "unavailable"]},
        "database": {"type": "string", "description": "`ok`, or the error met reaching the database "
                     "(staff and the metrics token only)."},
        "redis": {"type": "string", "description": "`ok`, or the error met reaching Redis (staff and the metrics "
                  "token only)."},
    },
    "required": ["status"],
}


def add_healthz(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: document `GET /healthz` (a plain Django view)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Health"] = HEALTH_SCHEMA
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}
    result.setdefault("paths", {})["/healthz"] = {
        "get": {
            "operationId": "healthz",
            "summary": "Is the platform healthy?",
            "description": "200 when the database and Redis answer, else 503. Anyone gets the status; staff and "
                           "`Authorization: Bearer $METRICS_TOKEN` also get each check.",
            "tags": ["health"],
            "security": [],
            "responses": {
                "200": {"description": "Healthy.", "content": body},
                "503": {"description": "The database or Redis does not answer.", "content": body},
            },
        }
    }
    return result
