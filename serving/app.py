"""The serving host's HTTP API: management under ``/manage/`` (the platform's shared secret),
inference under ``/v1/`` (``:predict`` for classifiers and taggers, OpenAI's chat and completions
for generative models), liveness and readiness at ``/healthz`` and ``/readyz``.

Errors have one shape, OpenAI's: ``{"error": {"message", "type", "param", "code"}}``.

Whoever holds no key learns nothing and costs nothing: the key is checked before a byte of the
body is read; an unknown endpoint, a missing key and a key of another endpoint get one and the
same 401; a body over ``max_body`` bytes is refused with 413 as soon as its Content-Length or
the bytes read so far exceed it; the management secret is no key of the inference API."""

import asyncio
import hashlib
import hmac
import json
import math
import random
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.generation import RUNTIMES as GENERATIVE_RUNTIMES
from runtime.inference import read_manifest
from serving import chat_api, engines
from serving.engines import EngineRevision
from serving.generative import GenerativeRevision
from serving.metrics import BUCKETS_MS, Metrics
from serving.revision import PredictError, Revision

MAX_INPUTS = 256  # per request, unless the endpoint says otherwise
MAX_CHARS = 20_000  # per text
REQUEST_TIMEOUT_S = 60.0
# A request body's limit unless SERVING_MAX_BODY_MB says otherwise: the largest valid predict
# request (256 inputs of 20,000 characters, JSON-escaped) stays below it.
MAX_BODY_MB = 32


class InputError(Exception):
    def __init__(self, message: str, status: int = 422, index: int | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.index = message, status, index


class TokenBucket:
    """``rate`` requests per second on average, bursts of up to ``burst``."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def take(self) -> float:
        """0 when a request may pass, else the seconds until one may."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass
class Route_:
    """How an endpoint routes: revision keys with weights, the accepted key hashes."""

    revisions: dict[str, int] = field(default_factory=dict)
    # sha256 → {"id", "rate_per_s", "expires_at" (epoch seconds or None)}
    keys: dict[str, dict] = field(default_factory=dict)
    max_inputs: int = MAX_INPUTS
    # The sha256 of the platform's own key to this endpoint (the console's try-it box and
    # playground, pre-annotation): no rate limit, no expiry, not listed among the keys.
    platform_key: str = ""

    def key(self, key_hash: str) -> dict | None:
        """The key record of a key hash, or None when the key is not one of this endpoint's."""
        if key_hash in self.keys:
            return self.keys[key_hash]
        if self.platform_key and hmac.compare_digest(key_hash, self.platform_key):
            return PLATFORM_KEY
        return None


PLATFORM_KEY = {"id": "platform", "rate_per_s": None, "expires_at": None}
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class Host:
    def __init__(self, secret: str, devices: list[str], max_body: int = MAX_BODY_MB << 20) -> None:
        if not secret:
            raise ValueError("the serving host needs a shared secret (SERVING_SECRET)")
        if max_body < 1:
            raise ValueError(f"the request body limit must be positive, not {max_body} bytes")
        self.secret = secret
        self.devices = devices
        self.max_body = max_body
        self.boot_id = uuid.uuid4().hex
        self.started_at = time.time()
        self.revisions: dict[str, Revision] = {}
        self.endpoints: dict[str, Route_] = {}
        self.metrics = Metrics()
        self.buckets: dict[str, TokenBucket] = {}
        # key hash → the endpoints that accept it, to refuse an unknown key before reading the
        # body of a chat or completions call (whose body names the endpoint).
        self.key_index: dict[str, set[str]] = {}

    def is_secret(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.secret.encode())

    def set_route(self, name: str, route: Route_ | None) -> None:
        if route is None:
            self.endpoints.pop(name, None)
        else:
            self.endpoints[name] = route
        index: dict[str, set[str]] = {}
        for endpoint, r in self.endpoints.items():
            for key_hash in [*r.keys, *([r.platform_key] if r.platform_key else [])]:
                index.setdefault(key_hash, set()).add(endpoint)
        self.key_index = index

    def choose(self, route: Route_) -> Revision | None:
        """A ready revision by weight. A revision gets traffic only once ready; when no weighted
        revision is ready yet, a ready one the platform keeps loaded (weight 0, being replaced)
        answers, so a rollout never leaves the endpoint without an answer."""
        ready = {k: self.revisions[k] for k in route.revisions if self._ready(k)}
        weighted = [(k, w) for k, w in route.revisions.items() if w > 0 and k in ready]
        if weighted:
            keys, weights = zip(*weighted, strict=True)
            return ready[random.choices(keys, weights)[0]]  # noqa: S311 - a traffic split
        return next(iter(ready.values()), None)

    def _ready(self, key: str) -> bool:
        rev = self.revisions.get(key)
        return rev is not None and rev.state == "ready"


def _presented_key(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "").strip()


def _key_hash(presented: str) -> str:
    return hashlib.sha256(presented.encode()).hexdigest() if presented else ""


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def _error(
    status: int,
    code: str,
    message: str,
    headers: dict | None = None,
    param: str | None = None,
    **extra,
) -> JSONResponse:
    error = {
        "message": message,
        "type": ERROR_TYPES.get(status, "server_error"),
        "param": param,
        "code": code,
        **extra,
    }
    return JSONResponse({"error": error}, status, headers)


# One answer for a missing key, a wrong key, a key of another endpoint and an unknown endpoint,
# so that endpoint names cannot be told from the answers. The connection is closed: a body the
# client is still sending is not read.
UNAUTHORIZED_MESSAGE = (
    "a valid API key of this endpoint is required (Authorization: Bearer <key>); the endpoint "
    "may not exist"
)


def _unauthorized() -> JSONResponse:
    return _error(401, "unauthorized", UNAUTHORIZED_MESSAGE, headers={"Connection": "close"})


class BodyTooLarge(Exception):
    pass


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


def _too_large(limit: int) -> JSONResponse:
    # The connection stays open: the rest of the body is read and dropped (uvicorn holds no
    # more of it than its flow control's 64 KB), so that the client hears this answer.
    return _error(
        413,
        "body_too_large",
        f"the request body exceeds {limit / (1 << 20):g} MB (SERVING_MAX_BODY_MB)",
    )


async def read_json(request: Request, limit: int) -> object:
    """The body parsed as JSON; BodyTooLarge over the limit, InputError (400) if not JSON."""
    raw = await read_body(request, limit)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"the body is not valid JSON: {exc}", 400) from None
    except RecursionError:  # [[[[…]]]] a hundred thousand deep: refused, not a 500
        raise InputError("the body is nested too deeply to be read as JSON", 400) from None


def parse_inputs(body: object, task_kind: str, max_inputs: int) -> list:
    """The inputs of a predict request, or InputError saying what is wrong and where."""
    if not isinstance(body, dict) or "inputs" not in body:
        raise InputError('the body must be a JSON object with "inputs": a list', 400)
    inputs = body["inputs"]
    if not isinstance(inputs, list):
        raise InputError('"inputs" must be a list', 400)
    if not inputs:
        raise InputError('"inputs" is empty: send at least one input', 400)
    if len(inputs) > max_inputs:
        raise InputError(f"{len(inputs)} inputs: at most {max_inputs} per request", 413)
    for i, item in enumerate(inputs):
        texts = _texts(item, task_kind, i)
        for name, text in texts.items():
            if not text.strip():
                raise InputError(f"inputs[{i}]{name} is empty", index=i)
            if len(text) > MAX_CHARS:
                raise InputError(
                    f"inputs[{i}]{name} has {len(text)} characters: at most {MAX_CHARS}", index=i
                )
    return [
        {"text_a": it["text_a"], "text_b": it["text_b"]}
        if task_kind == "text_pair"
        else (it if isinstance(it, str) else it["text"])
        for it in inputs
    ]


def _texts(item: object, task_kind: str, i: int) -> dict[str, str]:
    if task_kind == "text_pair":
        if not isinstance(item, dict):
            raise InputError(
                f'inputs[{i}] must be an object with "text_a" and "text_b" (a text pair model)',
                index=i,
            )
        fields = ("text_a", "text_b")
    elif isinstance(item, dict):
        fields = ("text",)
    elif isinstance(item, str):
        return {"": item}
    else:
        raise InputError(f"inputs[{i}] must be a string, not {type(item).__name__}", index=i)
    out = {}
    for f in fields:
        value = item.get(f)
        if not isinstance(value, str):
            raise InputError(f"inputs[{i}].{f} must be a string", index=i)
        out[f".{f}"] = value
    return out


def shape(pred: dict, top_k: int) -> dict:
    """A prediction as the API answers it: ranked scores instead of a score per label."""
    if "entities" in pred:
        return {"entities": pred["entities"], "truncated": pred["truncated"]}
    ranked = [
        {"label": label, "score": score}
        for label, score in sorted(pred["scores"].items(), key=lambda kv: -kv[1])
    ]
    if "labels" in pred:
        return {"labels": pred["labels"], "scores": ranked, "truncated": pred["truncated"]}
    return {
        "label": pred["label"],
        "score": pred["score"],
        "top_k": ranked[:top_k],
        "truncated": pred["truncated"],
    }


# -- inference ----------------------------------------------------------------------------------


async def admit(request: Request, host: "Host", name: str) -> Revision | Response:
    """The revision that answers a call to endpoint ``name``, or the error response: an unknown
    endpoint, a missing or wrong key, a key over its rate, no revision ready. Reads no body.

    An unknown endpoint and a key that is not this endpoint's (none, a wrong one, another
    endpoint's, the management secret) get the same answer; only a key of this endpoint hears
    that it expired."""
    route = host.endpoints.get(name)
    key_hash = _key_hash(_presented_key(request))
    key = route.key(key_hash) if route is not None and key_hash else None
    if key is None:
        if route is not None:  # counted for the endpoint's owners; unknown names are not kept
            host.metrics.count(name, "", "requests")
            host.metrics.count(name, "", "unauthorized")
        return _unauthorized()
    expires_at = key.get("expires_at")
    if expires_at is not None and float(expires_at) <= time.time():
        host.metrics.count(name, "", "requests")
        host.metrics.count(name, "", "unauthorized")
        when = datetime.fromtimestamp(float(expires_at), UTC).isoformat(timespec="minutes")
        return _error(401, "unauthorized", f"this API key expired on {when}")
    if key.get("rate_per_s"):
        bucket = host.buckets.get(key_hash)
        rate = float(key["rate_per_s"])
        if bucket is None or bucket.rate != rate:
            bucket = host.buckets[key_hash] = TokenBucket(rate, max(1.0, rate))
        wait = bucket.take()
        if wait:
            host.metrics.count(name, "", "requests")
            host.metrics.count(name, "", "rate_limited")
            return _error(
                429,
                "rate_limited",
                f"this key may send {rate:g} requests per second",
                headers={"Retry-After": str(math.ceil(wait))},
            )
    revision = host.choose(route)
    if revision is None:
        host.metrics.count(name, "", "requests")
        host.metrics.count(name, "", "errors")
        return _error(503, "not_ready", f"no revision of {name!r} is ready yet")
    return revision


async def predict(request: Request) -> Response:
    host: Host = request.app.state.host
    started = time.perf_counter()
    name = request.path_params["name"]
    revision = await admit(request, host, name)
    if isinstance(revision, Response):
        return revision
    route = host.endpoints[name]
    if isinstance(revision, GenerativeRevision | EngineRevision):
        return _error(
            400,
            "generative_endpoint",
            f"{name!r} is a generative model: call POST /v1/chat/completions or "
            f"/v1/completions with model={name!r}",
        )
    series = host.metrics.get(name, revision.key)
    series.counts["requests"] += 1
    try:
        body = await read_json(request, host.max_body)
        inputs = parse_inputs(body, revision.manifest["task_kind"], route.max_inputs)
        top_k = body.get("top_k", 5)
        if not isinstance(top_k, int) or top_k < 1:
            raise InputError('"top_k" must be a positive integer', 400)
    except BodyTooLarge:
        series.counts["client_errors"] += 1
        return _too_large(host.max_body)
    except InputError as exc:
        series.counts["client_errors"] += 1
        extra = {} if exc.index is None else {"index": exc.index}
        return _error(exc.status, "invalid_input", exc.message, **extra)
    series.counts["inputs"] += len(inputs)
    try:
        preds = await asyncio.wait_for(revision.predict(inputs), REQUEST_TIMEOUT_S)
    except (PredictError, TimeoutError) as exc:
        series.counts["errors"] += 1
        series.observe((time.perf_counter() - started) * 1000)
        return _error(503, "predict_failed", str(exc) or "the prediction timed out")
    series.observe((time.perf_counter() - started) * 1000)
    return JSONResponse(
        {
            "endpoint": name,
            "revision": revision.key,
            "model": revision.config.get("model", ""),
            "outputs": [shape(p, top_k) for p in preds],
        },
        headers={"X-Revision": revision.key},
    )


async def _openai(request: Request, chat: bool) -> Response:
    host: Host = request.app.state.host
    # The body names the endpoint: before reading it, the key must be one of some endpoint's.
    if _key_hash(_presented_key(request)) not in host.key_index:
        return _unauthorized()
    try:
        body = await read_json(request, host.max_body)
    except BodyTooLarge:
        return _too_large(host.max_body)
    except InputError as exc:
        return _error(400, "invalid_json", exc.message)
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return _error(
            400, "invalid_value", "model (the endpoint's name) is required", param="model"
        )
    name = body["model"]
    revision = await admit(request, host, name)
    if isinstance(revision, Response):
        return revision
    series = host.metrics.get(name, revision.key)
    series.counts["requests"] += 1
    if isinstance(revision, EngineRevision):
        try:
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await chat_api.proxy(body, path, name, revision, series)
        except chat_api.RequestError as exc:
            return _error(503, exc.code, exc.message)
    if not isinstance(revision, GenerativeRevision):
        series.counts["client_errors"] += 1
        return _error(
            400,
            "not_generative",
            f"{name!r} is not a generative model: call POST /v1/endpoints/{name}:predict",
            param="model",
        )
    try:
        return await chat_api.complete(request, body, name, revision, chat, series)
    except chat_api.RequestError as exc:
        failed = exc.code == "generation_failed"
        if not failed:
            series.counts["client_errors"] += 1
        return _error(503 if failed else 400, exc.code, exc.message, param=exc.param)


async def chat_completions(request: Request) -> Response:
    return await _openai(request, chat=True)


async def completions(request: Request) -> Response:
    return await _openai(request, chat=False)


# -- management ---------------------------------------------------------------------------------


def _manager(handler):
    async def wrapped(request: Request) -> Response:
        host: Host = request.app.state.host
        if not host.is_secret(_presented_key(request) or "\0"):
            return _error(
                401,
                "unauthorized",
                "the management API needs the shared secret",
                headers={"Connection": "close"},
            )
        try:
            return await handler(request, host)
        except BodyTooLarge:
            return _too_large(host.max_body)

    return wrapped


async def _body(request: Request) -> dict:
    body = await read_json(request, request.app.state.host.max_body)
    if not isinstance(body, dict):
        raise InputError("the body must be a JSON object", 400)
    return body


@_manager
async def state(request: Request, host: Host) -> Response:
    return JSONResponse(
        {
            "boot_id": host.boot_id,
            "started_at": host.started_at,
            "devices": host.devices,
            "engines": engines.installed(),
            "revisions": {k: r.describe() for k, r in host.revisions.items()},
            "endpoints": {
                name: {
                    "revisions": r.revisions,
                    "keys": len(r.keys),
                    # Key id → its expiry (epoch seconds, None: never); never the hashes.
                    "key_expiry": {str(k.get("id")): k.get("expires_at") for k in r.keys.values()},
                    "max_inputs": r.max_inputs,
                }
                for name, r in host.endpoints.items()
            },
        }
    )


def _revision_class(config: dict) -> type[Revision]:
    """A causal LM's export generates; every other predicts. An unreadable manifest makes a
    predictive revision, whose load then fails with the reason."""
    if config.get("engine") not in (None, "", engines.BUILTIN):
        return engines.EngineRevision
    try:
        runtime = read_manifest(Path(config["export_dir"]), verify=False).get("runtime")
    except (OSError, ValueError):
        return Revision
    return GenerativeRevision if runtime in GENERATIVE_RUNTIMES else Revision


@_manager
async def revision_put(request: Request, host: Host) -> Response:
    key = request.path_params["key"]
    try:
        config = await _body(request)
        if not isinstance(config.get("export_dir"), str):
            raise InputError('"export_dir" is required', 400)
    except InputError as exc:
        return _error(exc.status, "invalid", exc.message)
    current = host.revisions.get(key)
    wanted = _revision_class(config)(key, config)
    if current is not None and current.config == wanted.config and current.state != "failed":
        wanted.pool.shutdown()
        return JSONResponse(current.describe())
    if current is not None:
        await current.unload()
    host.revisions[key] = wanted
    request.app.state.loads.add(asyncio.create_task(wanted.load()))
    return JSONResponse(wanted.describe(), 202)


@_manager
async def revision_delete(request: Request, host: Host) -> Response:
    rev = host.revisions.pop(request.path_params["key"], None)
    if rev is None:
        return _error(404, "not_found", "no such revision on this host")
    await rev.unload()
    return Response(status_code=204)


@_manager
async def endpoint_put(request: Request, host: Host) -> Response:
    try:
        body = await _body(request)
        revisions = {str(k): int(w) for k, w in (body.get("revisions") or {}).items()}
        keys = {str(h): dict(v) for h, v in (body.get("keys") or {}).items()}
        max_inputs = int(body.get("max_inputs") or MAX_INPUTS)
        platform_key = str(body.get("platform_key") or "")
        if platform_key and not SHA256_HEX.fullmatch(platform_key):
            raise ValueError(f"platform_key is not a sha256 in hex: {platform_key[:80]!r}")
    except (InputError, TypeError, ValueError) as exc:
        return _error(400, "invalid", str(exc))
    route = Route_(revisions, keys, max_inputs, platform_key)
    host.set_route(request.path_params["name"], route)
    return Response(status_code=204)


@_manager
async def endpoint_delete(request: Request, host: Host) -> Response:
    host.set_route(request.path_params["name"], None)
    return Response(status_code=204)


@_manager
async def metrics(request: Request, host: Host) -> Response:
    return JSONResponse(
        {"boot_id": host.boot_id, "buckets_ms": BUCKETS_MS, "endpoints": host.metrics.snapshot()}
    )


async def healthz(request: Request) -> Response:
    """Alive; nothing more to whoever asks (the boot id is in /manage/state)."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when every revision it was told to load is ready (or failed, with its reason).
    Only ready or not, unless the management secret asks: then the revisions still loading."""
    host: Host = request.app.state.host
    loading = [k for k, r in host.revisions.items() if r.state == "loading"]
    answer: dict = {"ready": not loading}
    if host.is_secret(_presented_key(request) or "\0"):
        answer["loading"] = loading
    return JSONResponse(answer, 200 if not loading else 503)


def create_app(secret: str, devices: list[str], max_body_mb: float = MAX_BODY_MB) -> Starlette:
    host = Host(secret, devices, max(1, int(max_body_mb * (1 << 20))))

    @asynccontextmanager
    async def lifespan(app: Starlette):
        app.state.host = host
        app.state.loads = set()
        yield
        await asyncio.gather(*(r.unload() for r in host.revisions.values()))

    return Starlette(
        routes=[
            Route("/v1/endpoints/{name}:predict", predict, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/manage/state", state),
            Route("/manage/metrics", metrics),
            Route("/manage/revisions/{key}", revision_put, methods=["PUT"]),
            Route("/manage/revisions/{key}", revision_delete, methods=["DELETE"]),
            Route("/manage/endpoints/{name}", endpoint_put, methods=["PUT"]),
            Route("/manage/endpoints/{name}", endpoint_delete, methods=["DELETE"]),
        ],
        lifespan=lifespan,
    )
