"""What the OpenAPI schema (drf-spectacular) says beyond what it infers from the views: how to
authenticate, and the error answers that every operation may give."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

ERROR_SCHEMA = {
    "type": "object",
    "description": "Why the request was refused: `detail` for the request as a whole, else one "
    "entry per field of the body or query, each a list of messages.",
    "properties": {
        "detail": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
            ]
        }
    },
    "additionalProperties": True,
}

# Status → (description, whether only operations with path parameters give it).
ERRORS: dict[str, tuple[str, bool]] = {
    "400": ("The request is invalid; the body says what was wrong and where.", False),
    "401": ("No credentials, or an invalid, revoked or expired API token.", False),
    "403": ("The role of the user in the team does not allow this (or: site staff only).", False),
    "404": ("No such team for this user, or no such object in the team.", True),
    "415": ("The body's content type is not one this operation reads.", False),
    "429": (
        "Locked out: too many failed sign-ins or unknown tokens from this address (or for "
        "this account); Retry-After says when to try again.",
        False,
    ),
}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """``console.authentication.ApiTokenAuthentication``: a personal token as a Bearer."""

    target_class = "console.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token (`mp_…`) from the Tokens page or "
            "`POST /api/v1/tokens/`.",
        }


def document_errors(result: dict, generator, request, public) -> dict:
    """Postprocessing hook: the error answers of every operation, in one shape, ``Error``.
    Statuses an operation documents itself are left as they are."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            has_path_params = "{" in path
            for status, (description, needs_params) in ERRORS.items():
                if needs_params and not has_path_params:
                    continue
                if status == "415" and "requestBody" not in operation:
                    continue
                operation["responses"].setdefault(
                    status,
                    {"description": description, "content": {"application/json": {"schema": ref}}},
                )
    return result
