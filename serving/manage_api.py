"""The management API under ``/manage/``, for the platform's reconciler alone (the shared
secret): the host's state, loading and unloading revisions, routing endpoints, the metrics."""

import asyncio
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from runtime.adapters import MAX_ADAPTERS, NAME
from runtime.generation import RUNTIMES as GENERATIVE_RUNTIMES
from runtime.inference import read_manifest
from serving import engines, protocol
from serving.generative import GenerativeRevision
from serving.host import MAX_INPUTS, MAX_TOKENS, SHA256_HEX, Host, Route_
from serving.metrics import BUCKETS_MS
from serving.protocol import BodyTooLarge, InputError
from serving.revision import Revision


def _manager(handler):
    async def wrapped(request: Request) -> Response:
        host: Host = request.app.state.host
        if not host.is_secret(protocol.presented_key(request) or "\0"):
            return protocol.error(
                401,
                "unauthorized",
                "the management API needs the shared secret",
                headers={"Connection": "close"},
            )
        try:
            return await handler(request, host)
        except BodyTooLarge:
            return protocol.too_large(host.max_body)

    return wrapped


async def _body(request: Request) -> dict:
    body = await protocol.read_json(request, request.app.state.host.max_body)
    if not isinstance(body, dict):
        raise InputError("the body must be a JSON object", 400)
    return body


@_manager
async def state(request: Request, host: Host) -> Response:
    return protocol.JSONResponse(
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
                    "adapters": sorted(r.adapters),
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


def _check_adapters(config: dict) -> None:
    """``adapters``: {name: {"export_dir": str, "manifest_sha256": str}}, if any."""
    adapters = config.get("adapters")
    if adapters is None:
        return
    if not isinstance(adapters, dict) or len(adapters) > MAX_ADAPTERS:
        raise InputError(f'"adapters" must be an object of at most {MAX_ADAPTERS} adapters', 400)
    for name, spec in adapters.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("export_dir"), str):
            raise InputError(f'adapter {name!r} needs an "export_dir"', 400)


def _but_adapters(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "adapters"}


@_manager
async def revision_put(request: Request, host: Host) -> Response:
    key = request.path_params["key"]
    try:
        config = await _body(request)
        if not isinstance(config.get("export_dir"), str):
            raise InputError('"export_dir" is required', 400)
        _check_adapters(config)
    except InputError as exc:
        return protocol.error(exc.status, "invalid", exc.message)
    current = host.revisions.get(key)
    wanted = _revision_class(config)(key, config)
    if current is not None and current.config == wanted.config and current.state != "failed":
        wanted.pool.shutdown()
        return protocol.JSONResponse(current.describe())
    if (
        isinstance(current, GenerativeRevision)
        and current.state in ("loading", "ready")
        and _but_adapters(current.config) == _but_adapters(wanted.config)
    ):
        # Only its adapters changed: loaded and unloaded in place, the model not again.
        wanted.pool.shutdown()
        request.app.state.loads.add(
            asyncio.create_task(current.set_adapters(wanted.config.get("adapters") or {}))
        )
        return protocol.JSONResponse(current.describe())
    if current is not None:
        await current.unload()
    host.revisions[key] = wanted
    request.app.state.loads.add(asyncio.create_task(wanted.load()))
    return protocol.JSONResponse(wanted.describe(), 202)


@_manager
async def revision_delete(request: Request, host: Host) -> Response:
    rev = host.revisions.pop(request.path_params["key"], None)
    if rev is None:
        return protocol.error(404, "not_found", "no such revision on this host")
    await rev.unload()
    return Response(status_code=204)


@_manager
async def endpoint_put(request: Request, host: Host) -> Response:
    try:
        body = await _body(request)
        revisions = {str(k): int(w) for k, w in (body.get("revisions") or {}).items()}
        keys = {str(h): dict(v) for h, v in (body.get("keys") or {}).items()}
        max_inputs = int(body.get("max_inputs") or MAX_INPUTS)
        max_tokens = int(body.get("max_tokens") or MAX_TOKENS)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, not {max_tokens}")
        platform_key = str(body.get("platform_key") or "")
        if platform_key and not SHA256_HEX.fullmatch(platform_key):
            raise ValueError(f"platform_key is not a sha256 in hex: {platform_key[:80]!r}")
        # Adapter name → {"rate_per_s": requests per second over all keys, or None}.
        adapters = {str(n): dict(v) for n, v in (body.get("adapters") or {}).items()}
        for name in adapters:
            if not NAME.fullmatch(name) or len(adapters) > MAX_ADAPTERS:
                raise ValueError(f"{name[:80]!r} is not an adapter name, or there are too many")
    except (InputError, TypeError, ValueError) as exc:
        return protocol.error(400, "invalid", str(exc))
    route = Route_(revisions, keys, max_inputs, max_tokens, platform_key, adapters)
    host.set_route(request.path_params["name"], route)
    return Response(status_code=204)


@_manager
async def endpoint_delete(request: Request, host: Host) -> Response:
    host.set_route(request.path_params["name"], None)
    return Response(status_code=204)


@_manager
async def metrics(request: Request, host: Host) -> Response:
    return protocol.JSONResponse(
        {"boot_id": host.boot_id, "buckets_ms": BUCKETS_MS, "endpoints": host.metrics.snapshot()}
    )
