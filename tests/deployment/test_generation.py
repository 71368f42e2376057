"""Generative endpoints on the serving host process, called with the ``openai`` client: chat and
completions, streaming and not, concurrent requests batched (continuous batching: a request
joins the batch in flight), per-request stops, OpenAI-style errors; answers equal the
in-process engine's."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import openai
import pytest
import requests

from tests.helpers.serving import (
    KEY,
    bare_generate,
    converge,
    conversation,
    load,
    openai_client,
    route,
)

QUESTIONS = [f"{a}加{b}等于几？" for a, b in ((1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4))]


@pytest.fixture
def chat_host(fresh_host, llm_exports):
    def serve(backend: str = "paddle", name: str = "assistant", **config):
        export = llm_exports("instruction", backend)
        rev = load(fresh_host, f"rev-{backend}", export, **config)
        assert rev["state"] == "ready", rev["error"]
        route(fresh_host, name, {f"rev-{backend}": 100})
        return export

    return serve


@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_chat_completions_stream_and_not_equal_the_engine(chat_host, fresh_host, backend):
    export = chat_host(backend)
    api = openai_client(fresh_host)
    question = conversation(QUESTIONS[1])
    answer = api.chat.completions.create(
        model="assistant", messages=question, max_tokens=16, temperature=0
    )
    text = answer.choices[0].message.content
    assert text == bare_generate(export, [question], max_tokens=16, temperature=0)[0]
    assert "等于" in text  # it learned the form of the answer
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.model == "assistant" and answer.object == "chat.completion"
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

    chunks = list(
        api.chat.completions.create(
            model="assistant",
            messages=question,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == answer.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == answer.usage.completion_tokens


def test_concurrent_requests_are_batched_and_each_stops_on_its_own(chat_host, fresh_host):
    export = chat_host(max_batch_size=8, max_wait_ms=50)
    api = openai_client(fresh_host)

    def ask(question: str) -> str:
        r = api.chat.completions.create(
            model="assistant", messages=conversation(question), max_tokens=12, temperature=0
        )
        return r.choices[0].message.content

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(ask, QUESTIONS))
    expected = bare_generate(
        export, [conversation(q) for q in QUESTIONS], max_tokens=12, temperature=0
    )
    assert answers == expected
    described = fresh_host.state()["revisions"]["rev-paddle"]
    assert described["batched_inputs"] == len(QUESTIONS) > described["batches"]

    # One request of a batch stops at its stop string, one at its token limit.
    with ThreadPoolExecutor(2) as pool:
        ask = partial(
            api.chat.completions.create,
            model="assistant",
            messages=conversation(QUESTIONS[1]),
            temperature=0,
        )
        stopped = pool.submit(ask, max_tokens=12, stop=["等于"])
        limited = pool.submit(ask, max_tokens=2)
    first = stopped.result().choices[0]
    assert "等于" not in first.message.content and first.finish_reason == "stop"
    assert expected[1].startswith(first.message.content)
    second = limited.result().choices[0]
    assert second.finish_reason == "length" and limited.result().usage.completion_tokens == 2


def test_a_request_joins_the_running_batch_and_ends_before_a_long_one(chat_host, fresh_host):
    """Continuous batching: a short request sent while a long one generates joins its batch
    and is answered long before the long one ends (static batching made it wait), as it
    would be alone."""
    export = chat_host(max_batch_size=8, max_wait_ms=0)
    api = openai_client(fresh_host)
    short_expected = bare_generate(
        export, [conversation(QUESTIONS[1])], max_tokens=6, temperature=0
    )
    events: list[str] = []
    started = threading.Event()
    usage = []

    def long_one() -> None:
        # A raw prompt this model continues greedily to its token limit.
        for chunk in api.completions.create(
            model="assistant",
            prompt="等于等于等于",
            max_tokens=64,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.choices and chunk.choices[0].text:
                started.set()
            if chunk.usage:
                usage.append(chunk.usage.completion_tokens)
        events.append("long done")

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(long_one)
        assert started.wait(30)
        short = api.chat.completions.create(
            model="assistant", messages=conversation(QUESTIONS[1]), max_tokens=6, temperature=0
        )
        events.append("short done")
        running.result()
    assert usage[0] >= 40  # long enough that a short request fits in its time many times
    assert events == ["short done", "long done"]
    assert short.choices[0].message.content == short_expected[0]


def test_completions_and_sampling(chat_host, fresh_host):
    chat_host()
    api = openai_client(fresh_host)
    done = api.completions.create(
        model="assistant", prompt="<|im_start|>user\n3加4等于几？", max_tokens=8, temperature=0
    )
    assert done.object == "text_completion" and done.choices[0].text
    seeded = [
        api.chat.completions.create(
            model="assistant",
            messages=conversation(QUESTIONS[0]),
            max_tokens=10,
            temperature=1.5,
            top_p=0.9,
            seed=7,
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]  # the same seed samples the same tokens
    # vLLM's min_tokens: no stop token before it.
    plain = api.chat.completions.create(
        model="assistant", messages=conversation(QUESTIONS[0]), max_tokens=60, temperature=0
    )
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 50
    forced = api.chat.completions.create(
        model="assistant",
        messages=conversation(QUESTIONS[0]),
        max_tokens=60,
        temperature=0,
        extra_body={"min_tokens": 60},
    )
    assert forced.choices[0].finish_reason == "length" and forced.usage.completion_tokens == 60


def test_bad_requests_get_openai_errors(chat_host, fresh_host, exports):
    chat_host()
    api = openai_client(fresh_host)
    with pytest.raises(openai.AuthenticationError):
        openai_client(fresh_host, "mpe_wrong").chat.completions.create(
            model="assistant", messages=conversation("你好")
        )
    # An unknown endpoint is answered as a wrong key: names cannot be enumerated.
    with pytest.raises(openai.AuthenticationError) as exc:
        api.chat.completions.create(model="nobody", messages=conversation("你好"))
    assert "nobody" not in exc.value.message
    cases = [
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
        ({"extra_body": {"min_tokens": "all"}}, "min_tokens"),
    ]
    for params, param in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            api.chat.completions.create(model="assistant", messages=conversation("你好"), **params)
        assert exc.value.body["param"] == param, exc.value.body
        assert exc.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as exc:
        api.chat.completions.create(
            model="assistant", messages=[{"role": "robot", "content": "你好"}]
        )
    assert exc.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as exc:
        api.chat.completions.create(
            model="assistant", messages=conversation("长" * 600), max_tokens=4
        )
    assert exc.value.body["code"] == "context_length_exceeded"
    r = requests.post(
        f"{fresh_host.url}/v1/chat/completions",
        data=b"{not json",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"

    # A classifier is not a chat model, and a chat model does not classify.
    load(fresh_host, "rev-cls", exports("text_classification"))
    route(fresh_host, "reviews", {"rev-cls": 100})
    with pytest.raises(openai.BadRequestError, match="not a generative model"):
        api.chat.completions.create(model="reviews", messages=conversation("你好"))
    r = fresh_host.predict("assistant", {"inputs": ["你好"]}, KEY)
    assert r.status_code == 400 and "chat/completions" in r.json()["error"]["message"]


@pytest.mark.django_db
def test_a_deployed_chat_model_answers_its_keys_and_the_playground(
    fresh_host, owner, team, model_version, client
):
    """Deploy a fine-tuned chat model, call it with an endpoint key through the openai client,
    chat in the console's playground (streamed), and read tokens/s and TTFT in its metrics."""
    from django.urls import reverse

    from deployment import selectors
    from deployment.keys import endpoint_key_create
    from deployment.metrics import metrics_collect
    from deployment.rollout import endpoint_deploy

    version = model_version("instruction", name="helper")
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=version)
    _key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
    converge(fresh_host, endpoint)
    api = openai.OpenAI(base_url=f"{fresh_host.url}/v1", api_key=plain, max_retries=0, timeout=60)
    answer = api.chat.completions.create(
        model="helper", messages=conversation(QUESTIONS[2]), max_tokens=12, temperature=0
    )
    assert "等于" in answer.choices[0].message.content
    streamed = api.chat.completions.create(
        model="helper",
        messages=conversation(QUESTIONS[2]),
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == (
        answer.choices[0].message.content
    )

    client.force_login(owner)
    url = reverse(
        "deployment:api_endpoint_chat", kwargs={"team": team.slug, "endpoint_id": endpoint.pk}
    )
    response = client.post(
        url,
        {"messages": conversation(QUESTIONS[2]), "max_tokens": 12, "temperature": 0},
        content_type="application/json",
    )
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    events = b"".join(response.streaming_content).decode().split("\n\n")
    assert events[-2] == "data: [DONE]"
    text = "".join(
        (json.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for e in events[:-2]
    )
    assert text == answer.choices[0].message.content
    bad = client.post(url, {"messages": []}, content_type="application/json")
    assert bad.status_code == 400

    page = client.get(
        reverse("deployment:endpoint", kwargs={"team": team.slug, "endpoint_id": endpoint.pk})
    ).content.decode()
    assert 'data-testid="playground"' in page and "/v1/chat/completions" in page

    metrics_collect()
    figures = selectors.endpoint_metrics(endpoint)["total"]
    assert figures["requests"] == 3 and figures["completion_tokens"] > 0
    assert figures["tokens_per_s"] > 0 and figures["ttft_p50_ms"] is not None
