"""Limits an attacker with an endpoint key of a chat model chooses around: how many requests
wait (a full queue answers 429 with Retry-After, and a client that goes away frees its slot)
and how long a reply may be (max_tokens capped by the endpoint and the model's context)."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.helpers.serving import conversation, load, openai_client, route


@pytest.fixture
def chat_host(fresh_host, llm_exports):
    def serve(**config):
        rev = load(fresh_host, "rev-paddle", llm_exports("instruction", "paddle"), **config)
        assert rev["state"] == "ready", rev["error"]
        route(fresh_host, "assistant", {"rev-paddle": 100})

    return serve


def test_a_full_queue_answers_429_with_retry_after_and_a_gone_client_frees_its_slot(
    chat_host, fresh_host
):
    chat_host(max_batch_size=1, max_wait_ms=0, max_queue=1)
    api = openai_client(fresh_host)

    def state() -> dict:
        return fresh_host.state()["revisions"]["rev-paddle"]

    def long_stream():
        # A raw prompt this model continues greedily to its token limit.
        return api.completions.create(
            model="assistant", prompt="等于等于等于", max_tokens=200, temperature=0, stream=True
        )

    running = long_stream()
    next(iter(running))  # generating: the batch (of one) is full
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(lambda: "".join(c.choices[0].text for c in long_stream()))
        deadline = time.monotonic() + 30
        while state()["queued"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(openai.RateLimitError) as refused:
            api.chat.completions.create(
                model="assistant", messages=conversation("1加2等于几？"), max_tokens=4
            )
        assert refused.value.code == "queue_full"
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        # The first client goes away: its request leaves the batch, and the queued one runs.
        running.close()
        assert queued.result(timeout=60)
    assert state()["cancelled"] == 1 and state()["running"] == 0


def test_max_tokens_is_capped_by_the_endpoints_limit_and_the_models_context(
    chat_host, fresh_host, llm_exports
):
    chat_host()
    api = openai_client(fresh_host)
    # A raw prompt this model continues greedily to its token limit.
    asked = {"model": "assistant", "prompt": "等于等于等于", "temperature": 0}
    route(fresh_host, "assistant", {"rev-paddle": 100}, max_tokens=5)
    capped = api.completions.create(**asked, max_tokens=100_000)
    assert capped.usage.completion_tokens == 5 and capped.choices[0].finish_reason == "length"
    # min_tokens does not lift the cap: it is capped with max_tokens.
    forced = api.completions.create(**asked, max_tokens=100_000, extra_body={"min_tokens": 10**9})
    assert forced.usage.completion_tokens == 5
    # Without a cap of the endpoint's, the room the prompt leaves in the context is the cap.
    context = json.loads((llm_exports("instruction", "paddle") / "config.json").read_text())[
        "max_position_embeddings"
    ]
    route(fresh_host, "assistant", {"rev-paddle": 100}, max_tokens=10**6)
    prompt = "等" * (context - 3)
    tight = api.completions.create(**{**asked, "prompt": prompt}, max_tokens=100_000)
    assert tight.usage.prompt_tokens + tight.usage.completion_tokens <= context


@pytest.mark.django_db
def test_an_endpoints_tokens_per_reply_is_bounded(owner, team, model_version):
    """The cap itself is bounded: no endpoint lets a reply run past MAX_TOKENS_LIMIT."""
    from django.core.exceptions import ValidationError

    from deployment import rollout
    from deployment.models import MAX_TOKENS_LIMIT, Endpoint

    version = model_version()
    for wrong in (0, MAX_TOKENS_LIMIT + 1, 10**12):
        with pytest.raises(ValidationError, match="between 1 and"):
            rollout.endpoint_deploy(actor=owner, team=team, model_version=version, max_tokens=wrong)
    assert not Endpoint.objects.exists()
