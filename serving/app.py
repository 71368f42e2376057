"""The serving host's HTTP app: the inference API under ``/v1/`` (``inference_api.py``), the
management API under ``/manage/`` (``manage_api.py``), liveness and readiness at ``/healthz`` and
``/readyz``, Prometheus's ``/metrics`` (``prometheus.py``). Errors have one shape, OpenAI's
(``protocol.py``)."""

import asyncio
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving import inference_api, manage_api, prometheus, protocol
from serving.host import MAX_BODY_MB, Host


async def healthz(request: Request) -> Response:
    """Alive; nothing more to whoever asks (the boot id is in /manage/state)."""
    return protocol.JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when every revision it was told to load is ready (or failed, with its reason).
    Only ready or not, unless the management secret asks: then the revisions still loading."""
    host: Host = request.app.state.host
    loading = [k for k, r in host.revisions.items() if r.state == "loading"]
    answer: dict = {"ready": not loading}
    if host.is_secret(protocol.presented_key(request) or "\0"):
        answer["loading"] = loading
    return protocol.JSONResponse(answer, 200 if not loading else 503)


async def metrics(request: Request) -> Response:
    """The host's figures for Prometheus, to the token or the addresses configured (404 to
    anyone else: an endpoint's callers do not learn it exists)."""
    token, allow = request.app.state.metrics_access
    client = request.client.host if request.client else ""
    if not prometheus.scrape_allowed(
        request.headers.get("authorization", ""), client, token, allow
    ):
        return protocol.error(404, "not_found", "not found")
    body = prometheus.exposition(prometheus.HostCollector(request.app.state.host))
    return Response(body, media_type=prometheus.CONTENT_TYPE)


def create_app(secret: str, devices: list[str], max_body_mb: float = MAX_BODY_MB) -> Starlette:
    host = Host(secret, devices, max(1, int(max_body_mb * (1 << 20))))

    @asynccontextmanager
    async def lifespan(app: Starlette):
        app.state.host = host
        app.state.loads = set()
        app.state.metrics_access = prometheus.access_from_env()
        yield
        await asyncio.gather(*(r.unload() for r in host.revisions.values()))

    return Starlette(
        routes=[
            Route("/v1/endpoints/{name}:predict", inference_api.predict, methods=["POST"]),
            Route("/v1/chat/completions", inference_api.chat_completions, methods=["POST"]),
            Route("/v1/completions", inference_api.completions, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/manage/state", manage_api.state),
            Route("/manage/metrics", manage_api.metrics),
            Route("/manage/revisions/{key}", manage_api.revision_put, methods=["PUT"]),
            Route("/manage/revisions/{key}", manage_api.revision_delete, methods=["DELETE"]),
            Route("/manage/endpoints/{name}", manage_api.endpoint_put, methods=["PUT"]),
            Route("/manage/endpoints/{name}", manage_api.endpoint_delete, methods=["DELETE"]),
        ],
        lifespan=lifespan,
    )
