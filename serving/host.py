"""A serving host's state: the revisions it holds, how each endpoint routes (revisions by
weight, the hashes of the keys it accepts), the rate limits of keys, its metrics."""

import hmac
import random
import re
import time
import uuid
from dataclasses import dataclass, field

from serving.metrics import Metrics
from serving.revision import Revision

MAX_INPUTS = 256  # per request, unless the endpoint says otherwise
MAX_TOKENS = 1024  # an endpoint's cap on a reply's tokens when the platform sets none
# A request body's limit unless SERVING_MAX_BODY_MB says otherwise: the largest valid predict
# request (256 inputs of 20,000 characters, JSON-escaped) stays below it.
MAX_BODY_MB = 32


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
    # Generative endpoints: a reply's tokens at most (a request asking more is capped).
    max_tokens: int = MAX_TOKENS
    # The sha256 of the platform's own key to this endpoint (the console's try-it box and
    # playground, pre-annotation): no rate limit, no expiry, not listed among the keys.
    platform_key: str = ""
    # Generative endpoints: the LoRA adapters requests may name (``model`` "<endpoint>/<name>"),
    # each {"rate_per_s": its requests per second over all keys, or None}. A key's record may
    # hold "adapters", the names it may call (None: all).
    adapters: dict[str, dict] = field(default_factory=dict)

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

    def choose(self, route: Route_, adapter: str = "") -> Revision | None:
        """A ready revision by weight (with ``adapter``: of those where it is ready). A revision
        gets traffic only once ready; when no weighted revision is ready yet, a ready one the
        platform keeps loaded (weight 0, being replaced) answers, so a rollout never leaves the
        endpoint without an answer."""
        ready = {k: self.revisions[k] for k in route.revisions if self._ready(k, adapter)}
        weighted = [(k, w) for k, w in route.revisions.items() if w > 0 and k in ready]
        if len(weighted) == 1:  # most endpoints, most of the time: no draw
            return ready[weighted[0][0]]
        if weighted:
            keys, weights = zip(*weighted, strict=True)
            return ready[random.choices(keys, weights)[0]]  # noqa: S311 - a traffic split
        return next(iter(ready.values()), None)

    def _ready(self, key: str, adapter: str = "") -> bool:
        rev = self.revisions.get(key)
        if rev is None or rev.state != "ready":
            return False
        return not adapter or self._adapter(rev, adapter).get("state") == "ready"

    @staticmethod
    def _adapter(rev: Revision, adapter: str) -> dict:
        state = getattr(rev, "adapter_state", None)  # generative revisions serve adapters
        return (state(adapter) if state else None) or {"state": "not loaded", "error": ""}

    def adapter_problem(self, route: Route_, adapter: str) -> str:
        """Why no revision of the route answers for ``adapter``: its state on each."""
        found = []
        for key in route.revisions:
            rev = self.revisions.get(key)
            if rev is not None and rev.state == "ready":
                state = self._adapter(rev, adapter)
                error = f" ({state['error']})" if state["error"] else ""
                found.append(f"{state['state']} on {key}{error}")
        return f"adapter {adapter!r} is " + "; ".join(found) if found else ""
