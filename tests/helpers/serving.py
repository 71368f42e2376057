"""The serving host: its management API (load a revision, route an endpoint), the
reconciler until an endpoint is ready, the OpenAI-compatible client, and the in-process
engines' answers in the runtime venv to compare with."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from tests.helpers.models import in_runtime

KEY = "mpe_test-key-0123456789"
KEY_HASH = hashlib.sha256(KEY.encode()).hexdigest()


def load(host, key: str, export, **config) -> dict:
    """Load ``export`` on ``host`` as revision ``key``; the revision once it is ready (or not)."""
    r = host.manage("PUT", f"/manage/revisions/{key}", {"export_dir": str(export), **config})
    assert r.status_code in (200, 202), r.text
    return host.wait_ready(key)


def route(
    host,
    name: str,
    revisions: dict,
    keys: dict | None = None,
    max_inputs: int = 64,
    max_tokens: int | None = None,
    adapters: dict | None = None,
):
    """Route endpoint ``name`` to ``revisions`` (name: weight), open to ``keys`` (KEY unless
    told), with ``adapters`` (name: {"rate_per_s"})."""
    keys = {KEY_HASH: {"id": 1, "rate_per_s": None}} if keys is None else keys
    body = {"revisions": revisions, "keys": keys, "max_inputs": max_inputs}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if adapters is not None:
        body["adapters"] = adapters
    r = host.manage("PUT", f"/manage/endpoints/{name}", body)
    assert r.status_code == 204, r.text


def converge(host, endpoint, timeout: float = 90) -> None:
    """Run the reconciler until every active revision of ``endpoint`` is ready on the host."""
    from deployment.models import Placement, Revision
    from deployment.reconcile import endpoints_reconcile

    deadline = time.monotonic() + timeout
    while True:
        endpoints_reconcile()
        active = endpoint.revisions.filter(status=Revision.Status.ACTIVE)
        states = [p.state for p in Placement.objects.filter(revision__in=active)]
        if len(states) == active.count() and set(states) == {"ready"}:
            endpoints_reconcile()  # routes, and unloads what was replaced
            return
        assert "failed" not in states, list(Placement.objects.values("state", "error"))
        assert time.monotonic() < deadline, states
        time.sleep(0.3)


def wait_adapters(host, key: str, timeout: float = 60) -> dict:
    """Revision ``key``'s adapters once none is loading any more: name → state."""
    deadline = time.monotonic() + timeout
    while True:
        adapters = host.state()["revisions"][key]["adapters"]
        if all(a["state"] != "loading" for a in adapters.values()):
            return adapters
        assert time.monotonic() < deadline, adapters
        time.sleep(0.2)


def openai_client(host, key: str = KEY):
    """The ``openai`` client of ``host``'s OpenAI-compatible API, with ``key``."""
    import openai

    return openai.OpenAI(base_url=f"{host.url}/v1", api_key=key, max_retries=0, timeout=60)


def conversation(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def bare_generate(export: Path, conversations: list[list[dict]], **params) -> list[str]:
    """The in-process engine's completions of a batch (in the runtime venv)."""
    code = (
        "import json,sys\n"
        "from pathlib import Path\n"
        "from runtime.generation import Generator, GenerationRequest\n"
        "g = Generator(Path(sys.argv[1]))\n"
        "args = json.loads(sys.stdin.read())\n"
        "reqs = [GenerationRequest(g.chat_prompt(c), **args['params']) for c in args['convs']]\n"
        "print(json.dumps(g.generate(reqs), ensure_ascii=False))\n"
    )
    return _answers(code, export, {"convs": conversations, "params": params})


def bare_predict(export: Path, items: list) -> list[dict]:
    """The in-process predictor's answers (in the runtime venv, where Paddle is)."""
    code = (
        "import json,sys\n"
        "from runtime.inference import Predictor\n"
        "p = Predictor.load(sys.argv[1])\n"
        "print(json.dumps(p.predict(json.loads(sys.stdin.read())), ensure_ascii=False))\n"
    )
    return _answers(code, export, items)


def _answers(code: str, export: Path, payload) -> list:
    """What ``code`` prints last as JSON, run in the runtime venv on ``export`` (its argv[1])
    with ``payload`` as JSON on its stdin."""
    stdin = json.dumps(payload, ensure_ascii=False)
    out = in_runtime(code, str(export), env=dict(os.environ), stdin=stdin, timeout=120)
    return json.loads(out.strip().splitlines()[-1])
