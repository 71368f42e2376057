"""What the serving host's two APIs share: the one error shape (OpenAI's,
``{"error": {"message", "type", "param", "code"}}``), the key a caller presents, and request
bodies read within a limit (413 as soon as the limit is passed, never holding more)."""

import hashlib

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSON


class JSONResponse(_StarletteJSON):
    """Every JSON answer of the host, encoded by orjson: the bytes json.dumps would write
    (compact, UTF-8), several times faster, on the path every request takes."""

    def render(self, content: object) -> bytes:
        return dumps(content)


def dumps(content: object) -> bytes:
    return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)


def loads(raw: bytes | str) -> object:
    return orjson.loads(raw)


class InputError(Exception):
    def __init__(self, message: str, status: int = 422, index: int | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.index = message, status, index


class BodyTooLarge(Exception):
    pass


def presented_key(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "").strip()


def key_hash(presented: str) -> str:
    return hashlib.sha256(presented.encode()).hexdigest() if presented else ""


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error(
    status: int,
    code: str,
    message: str,
    headers: dict | None = None,
    param: str | None = None,
    **extra,
) -> JSONResponse:
    body = {
        "message": message,
        "type": ERROR_TYPES.get(status, "server_error"),
        "param": param,
        "code": code,
        **extra,
    }
    return JSONResponse({"error": body}, status, headers)


# One answer for a missing key, a wrong key, a key of another endpoint and an unknown endpoint,
# so that endpoint names cannot be told from the answers. The connection is closed: a body the
# client is still sending is not read.
UNAUTHORIZED_MESSAGE = (
    "a valid API key of this endpoint is required (Authorization: Bearer <key>); the endpoint "
    "may not exist"
)


def unauthorized() -> JSONResponse:
    return error(401, "unauthorized", UNAUTHORIZED_MESSAGE, headers={"Connection": "close"})


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (BodyTooLarge) once it is known to exceed ``limit`` bytes:
    by its Content-Length before a byte is read, else (chunked) as soon as the bytes read so
    far exceed it, never holding more than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge
    return bytes(body)


def too_large(limit: int) -> JSONResponse:
    # The connection stays open: the rest of the body is read and dropped (uvicorn holds no
    # more of it than its flow control's 64 KB), so that the client hears this answer.
    return error(
        413,
        "body_too_large",
        f"the request body exceeds {limit / (1 << 20):g} MB (SERVING_MAX_BODY_MB)",
    )


async def read_json(request: Request, limit: int) -> object:
    """The body parsed as JSON; BodyTooLarge over the limit, InputError (400) if not JSON."""
    raw = await read_body(request, limit)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # invalid UTF-8 among them
        if "depth limit" in str(exc):  # [[[[…]]]] deeper than orjson's 1,024 levels
            raise InputError("the body is nested too deeply to be read as JSON", 400) from None
        raise InputError(f"the body is not valid JSON: {exc}", 400) from None
