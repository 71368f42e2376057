"""The platform's client of a serving host's APIs (``serving/``): the management API with the
shared secret, the inference API with the platform's own key of each endpoint (the secret is no
key of the inference API); and the platform's own calls to an endpoint (the console's try-it box
and playground, pre-annotation), answered by the first serving host that is reachable."""

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import requests
from django.conf import settings
from django.utils.translation import gettext as _

from deployment.models import Endpoint


class HostError(Exception):
    """The host could not be reached or refused a call; the message says which and why."""


class HostRefused(HostError):
    """The endpoint refused that one request (400, 413, 422: a prompt past the model's
    context…); other requests may still be answered."""


def platform_key(endpoint: str) -> str:
    """The platform's own key to ``endpoint`` (the console's try-it box and playground,
    pre-annotation): derived from SERVING_SECRET, so it is stored nowhere; a host holds only its
    sha256, as of every key, and it opens no other endpoint."""
    if not settings.SERVING_SECRET:
        raise HostError("SERVING_SECRET is not set: the platform cannot call serving hosts")
    digest = hmac.new(
        settings.SERVING_SECRET.encode(), b"endpoint-key\0" + endpoint.encode(), hashlib.sha256
    )
    return "mpp_" + digest.hexdigest()


def platform_key_hash(endpoint: str) -> str:
    """What a host is told of the platform's key to ``endpoint``."""
    return hashlib.sha256(platform_key(endpoint).encode()).hexdigest()


class HostClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {settings.SERVING_SECRET}"

    def _call(self, method: str, path: str, json: Any = None, ok=(200, 202, 204)) -> Any:
        if not settings.SERVING_SECRET:
            raise HostError("SERVING_SECRET is not set: the platform cannot manage serving hosts")
        try:
            response = self.session.request(
                method, self.url + path, json=json, timeout=(3.0, self.timeout)
            )
        except requests.RequestException as exc:
            raise HostError(f"{self.url} is unreachable: {type(exc).__name__}") from exc
        if response.status_code not in ok:
            raise HostError(
                f"{self.url}{path} answered {response.status_code}: {response.text[:300]}"
            )
        return response.json() if response.content else None

    def state(self) -> dict:
        return self._call("GET", "/manage/state")

    def metrics(self) -> dict:
        return self._call("GET", "/manage/metrics")

    def load(self, key: str, config: dict) -> dict:
        return self._call("PUT", f"/manage/revisions/{key}", config)

    def unload(self, key: str) -> None:
        self._call("DELETE", f"/manage/revisions/{key}", ok=(204, 404))

    def route(self, endpoint: str, table: dict) -> None:
        self._call("PUT", f"/manage/endpoints/{endpoint}", table)

    def unroute(self, endpoint: str) -> None:
        self._call("DELETE", f"/manage/endpoints/{endpoint}")

    def predict(self, endpoint: str, body: dict) -> tuple[int, dict]:
        """Call the inference API as the platform (the console's try-it, pre-annotation)."""
        return self._infer(endpoint, f"/v1/endpoints/{endpoint}:predict", body)

    def chat(self, body: dict) -> tuple[int, dict]:
        """A chat completion as the platform (pre-annotation drafts), not streamed."""
        endpoint = body["model"].partition("/")[0]  # "<endpoint>/<adapter>": the endpoint's key
        return self._infer(endpoint, "/v1/chat/completions", {**body, "stream": False})

    @staticmethod
    def _as_platform(endpoint: str) -> dict[str, str]:
        """The headers of an inference call: the endpoint's platform key, not the secret."""
        return {"Authorization": f"Bearer {platform_key(endpoint)}"}

    def _infer(self, endpoint: str, path: str, body: dict) -> tuple[int, dict]:
        try:
            response = self.session.post(
                self.url + path,
                json=body,
                headers=self._as_platform(endpoint),
                timeout=(3.0, 120.0),
            )
        except requests.RequestException as exc:
            raise HostError(f"{self.url} is unreachable: {type(exc).__name__}") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = {"error": {"message": response.text[:300]}}
        if response.status_code == 429 and isinstance(answer, dict):
            answer["retry_after"] = response.headers.get("Retry-After", "")
        return response.status_code, answer

    def chat_stream(self, body: dict) -> Iterator[bytes]:
        """A streamed chat completion as the platform (the console's playground): the host's
        server-sent events as they come, or one error event with the host's reason."""
        try:
            response = self.session.post(
                f"{self.url}/v1/chat/completions",
                json={**body, "stream": True},
                headers=self._as_platform(body["model"].partition("/")[0]),
                stream=True,
                timeout=(3.0, 120.0),
            )
        except requests.RequestException as exc:
            raise HostError(f"{self.url} is unreachable: {type(exc).__name__}") from exc
        if response.status_code != 200:
            yield b"data: " + response.content[:2000] + b"\n\n"
            return
        with response:
            yield from response.iter_content(chunk_size=None)


# -- calling an endpoint as the platform -------------------------------------------------------


def endpoint_predict(*, endpoint: Endpoint, inputs: list, top_k: int = 5) -> tuple[int, dict]:
    """The endpoint's answer to ``inputs`` (the console's try-it box, pre-annotation), from the
    first host that serves it: (HTTP status, body). Counted in its metrics like any call."""
    errors = []
    for url in settings.SERVING_HOSTS:
        try:
            return HostClient(url).predict(endpoint.name, {"inputs": inputs, "top_k": top_k})
        except HostError as exc:
            errors.append(str(exc))
    raise HostError("; ".join(errors) or _("No serving host is configured."))


BUSY_RETRIES = 10
# Requests the platform keeps in flight to one endpoint (a judge, an endpoint's evaluation).
CONCURRENT = 4


def _retry_after(answer: dict) -> float:
    """The seconds a 429 asks to wait (Retry-After), within 0.1–30."""
    try:
        return min(max(float(answer.get("retry_after") or 1), 0.1), 30.0)
    except ValueError:
        return 1.0


def endpoint_chat_complete(
    *, endpoint: Endpoint, messages: list[dict], max_tokens: int, adapter: str = ""
) -> str:
    """A generative endpoint's greedy reply to ``messages`` (at most ``max_tokens``, the
    endpoint's own cap applying), from the first reachable host; from its ``adapter``, if
    named."""
    errors = []
    body = {
        "model": f"{endpoint.name}/{adapter}" if adapter else endpoint.name,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    for url in settings.SERVING_HOSTS:
        try:
            status, answer = HostClient(url).chat(body)
            # A full queue or a rate limit (the adapter's): waited out, as a client would.
            for _retry in range(BUSY_RETRIES):
                if status != 429:
                    break
                time.sleep(_retry_after(answer))
                status, answer = HostClient(url).chat(body)
        except HostError as exc:
            errors.append(str(exc))
            continue
        if status != 200:
            message = answer.get("error", {}).get("message", "")
            # The request's own fault; an unknown model, a key refused, a busy host are not.
            refused = HostRefused if status in (400, 413, 422) else HostError
            raise refused(f"{endpoint.name} answered {status}: {message}")
        return answer["choices"][0]["message"]["content"]
    raise HostError("; ".join(errors) or _("No serving host is configured."))


def endpoint_chat(*, endpoint: Endpoint, body: dict) -> Iterator[bytes]:
    """A generative endpoint's streamed answer to a chat (the console's playground), from the
    first serving host that is reachable. Counted in its metrics like any call."""
    errors = []
    for url in settings.SERVING_HOSTS:
        stream = HostClient(url).chat_stream({**body, "model": endpoint.name})
        try:
            first = next(stream)
        except HostError as exc:
            errors.append(str(exc))
            continue
        except StopIteration:
            return
        yield first
        yield from stream
        return
    message = "; ".join(errors) or _("No serving host is configured.")
    error = {"error": {"message": message, "type": "server_error", "code": "unreachable"}}
    yield b"data: " + json.dumps(error, ensure_ascii=False).encode() + b"\n\n"
