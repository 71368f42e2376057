"""The inference API under ``/v1/``, called with an endpoint's API key: ``:predict`` for
classifiers and taggers, OpenAI's chat and completions for generative models.

Whoever holds no key learns nothing and costs nothing: the key is checked before a byte of the
body is read; an unknown endpoint, a missing key and a key of another endpoint get one and the
same 401; the management secret is no key of this API."""

import math
import time
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from serving import chat_api, protocol
from serving.engines import EngineRevision
from serving.generative import GenerativeRevision
from serving.host import MAX_TOKENS, Host, TokenBucket
from serving.protocol import BodyTooLarge, InputError
from serving.revision import PredictError, Revision

MAX_CHARS = 20_000  # per text
REQUEST_TIMEOUT_S = 60.0


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
        fields: tuple[str, ...] = ("text_a", "text_b")
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
    """A prediction as the API answers it: ranked scores instead of a score per label;
    ``truncated``, and ``windows`` where a long text was read in several (runtime.data)."""
    read = {"truncated": pred["truncated"]}
    if "windows" in pred:
        read["windows"] = pred["windows"]
    if "entities" in pred:
        return {"entities": pred["entities"], **read}
    ranked = [
        {"label": label, "score": score}
        for label, score in sorted(pred["scores"].items(), key=lambda kv: -kv[1])
    ]
    if "labels" in pred:
        return {"labels": pred["labels"], "scores": ranked, **read}
    return {"label": pred["label"], "score": pred["score"], "top_k": ranked[:top_k], **read}


def _throttled(host: Host, bucket_key: str, rate: float) -> float:
    """0 when a request within ``rate`` per second may pass, else the seconds until one may."""
    bucket = host.buckets.get(bucket_key)
    if bucket is None or bucket.rate != rate:
        bucket = host.buckets[bucket_key] = TokenBucket(rate, max(1.0, rate))
    return bucket.take()


async def admit(request: Request, host: Host, name: str, adapter: str = "") -> Revision | Response:
    """The revision that answers a call to endpoint ``name`` (with its LoRA ``adapter``), or
    the error response: an unknown endpoint, a missing or wrong key, an adapter the endpoint
    lacks or the key may not call, a key or adapter over its rate, no revision ready. Reads no
    body.

    An unknown endpoint and a key that is not this endpoint's (none, a wrong one, another
    endpoint's, the management secret) get the same answer; only a key of this endpoint hears
    that it expired, and an adapter it may not call is one that does not exist."""
    route = host.endpoints.get(name)
    key_hash = protocol.key_hash(protocol.presented_key(request))
    key = route.key(key_hash) if route is not None and key_hash else None
    if route is None or key is None:
        if route is not None:  # counted for the endpoint's owners; unknown names are not kept
            host.metrics.count(name, "", "requests")
            host.metrics.count(name, "", "unauthorized")
        return protocol.unauthorized()
    expires_at = key.get("expires_at")
    if expires_at is not None and float(expires_at) <= time.time():
        host.metrics.count(name, "", "requests")
        host.metrics.count(name, "", "unauthorized")
        when = datetime.fromtimestamp(float(expires_at), UTC).isoformat(timespec="minutes")
        return protocol.error(401, "unauthorized", f"this API key expired on {when}")
    model = f"{name}/{adapter}" if adapter else name
    allowed = key.get("adapters")  # a key of some adapters calls them alone
    if (adapter and adapter not in route.adapters) or (
        allowed is not None and adapter not in allowed
    ):
        host.metrics.count(name, "", "requests")
        host.metrics.count(name, "", "client_errors")
        return protocol.error(
            404,
            "model_not_found",
            f"{model!r} is not a model of this endpoint that this key may call",
            param="model",
        )
    limits = [(key_hash, float(key.get("rate_per_s") or 0), "this key may send")]
    if adapter:
        rate = float(route.adapters[adapter].get("rate_per_s") or 0)
        limits.append((f"adapter:{model}", rate, f"{model!r} takes"))
    for bucket_key, rate, who in limits:
        wait = _throttled(host, bucket_key, rate) if rate else 0.0
        if wait:
            host.metrics.count(model, "", "requests")
            host.metrics.count(model, "", "rate_limited")
            return protocol.error(
                429,
                "rate_limited",
                f"{who} {rate:g} requests per second",
                headers={"Retry-After": str(math.ceil(wait))},
            )
    revision = host.choose(route, adapter)
    if revision is None:
        host.metrics.count(model, "", "requests")
        host.metrics.count(model, "", "errors")
        why = host.adapter_problem(route, adapter) if adapter else ""
        return protocol.error(503, "not_ready", why or f"no revision of {model!r} is ready yet")
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
        return protocol.error(
            400,
            "generative_endpoint",
            f"{name!r} is a generative model: call POST /v1/chat/completions or "
            f"/v1/completions with model={name!r}",
        )
    series = host.metrics.get(name, revision.key)
    series.counts["requests"] += 1
    try:
        body = await protocol.read_json(request, host.max_body)
        inputs = parse_inputs(body, revision.manifest["task_kind"], route.max_inputs)
        assert isinstance(body, dict)  # parse_inputs refused anything else
        top_k = body.get("top_k", 5)
        if not isinstance(top_k, int) or top_k < 1:
            raise InputError('"top_k" must be a positive integer', 400)
    except BodyTooLarge:
        series.counts["client_errors"] += 1
        return protocol.too_large(host.max_body)
    except InputError as exc:
        series.counts["client_errors"] += 1
        extra: dict[str, Any] = {} if exc.index is None else {"index": exc.index}
        return protocol.error(exc.status, "invalid_input", exc.message, **extra)
    series.counts["inputs"] += len(inputs)
    try:
        preds = await revision.predict(inputs, REQUEST_TIMEOUT_S)
    except (PredictError, TimeoutError) as exc:
        series.counts["errors"] += 1
        series.observe((time.perf_counter() - started) * 1000)
        return protocol.error(503, "predict_failed", str(exc) or "the prediction timed out")
    series.observe((time.perf_counter() - started) * 1000)
    return protocol.JSONResponse(
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
    if protocol.key_hash(protocol.presented_key(request)) not in host.key_index:
        return protocol.unauthorized()
    try:
        body = await protocol.read_json(request, host.max_body)
    except BodyTooLarge:
        return protocol.too_large(host.max_body)
    except InputError as exc:
        return protocol.error(400, "invalid_json", exc.message)
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return protocol.error(
            400, "invalid_value", "model (the endpoint's name) is required", param="model"
        )
    name = body["model"]
    # "<endpoint>/<adapter>": one of the LoRA adapters the endpoint serves over its model.
    endpoint, _slash, adapter = name.partition("/")
    revision = await admit(request, host, endpoint, adapter)
    if isinstance(revision, Response):
        return revision
    series = host.metrics.get(name, revision.key)  # per adapter too
    series.counts["requests"] += 1
    if isinstance(revision, EngineRevision):
        try:
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await chat_api.proxy(body, path, name, revision, series)
        except chat_api.RequestError as exc:
            return protocol.error(503, exc.code, exc.message)
    if not isinstance(revision, GenerativeRevision):
        series.counts["client_errors"] += 1
        return protocol.error(
            400,
            "not_generative",
            f"{name!r} is not a generative model: call POST /v1/endpoints/{name}:predict",
            param="model",
        )
    retry_after = revision.retry_after()
    if retry_after is not None:
        series.counts["rate_limited"] += 1
        return protocol.error(
            429,
            "queue_full",
            f"{name!r} has {revision.queue.qsize()} requests waiting, as many as it queues",
            headers={"Retry-After": str(retry_after)},
        )
    try:
        route = host.endpoints.get(endpoint)  # unrouted meanwhile: the host's default cap
        limit = route.max_tokens if route is not None else MAX_TOKENS
        return await chat_api.complete(request, body, name, revision, chat, series, limit, adapter)
    except chat_api.RequestError as exc:
        failed = exc.code == "generation_failed"
        if not failed:
            series.counts["client_errors"] += 1
        return protocol.error(503 if failed else 400, exc.code, exc.message, param=exc.param)


async def chat_completions(request: Request) -> Response:
    return await _openai(request, chat=True)


async def completions(request: Request) -> Response:
    return await _openai(request, chat=False)
