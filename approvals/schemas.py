"""Answer schemas of the built-in question types."""

# Approve or reject, with an optional reason.
APPROVAL_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 2000},
    },
    "required": ["approved"],
    "additionalProperties": False,
}


def is_approval(schema: dict) -> bool:
    """True for schemas whose answer is an approve/reject decision (rendered as two buttons)."""
    props = schema.get("properties") or {}
    return schema.get("type") == "object" and props.get("approved", {}).get("type") == "boolean"
