"""The OpenAI-compatible API of generative endpoints: ``POST /v1/chat/completions`` and
``POST /v1/completions``, with server-sent events when ``stream`` is true.

``model`` names the endpoint, or ``<endpoint>/<adapter>`` one of the LoRA adapters it serves
over its model (``serving/generative.py``); keys, rate limits and the traffic split are the
predictive API's (``inference_api.admit``). Errors have OpenAI's shape, ``{"error":
{"message", "type", "param", "code"}}``, so clients such as the ``openai`` package raise
their usual exceptions.
"""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime.chat import ROLES
from runtime.chat_template import ChatTemplateError
from runtime.generation import GenerationRequest
from serving import protocol
from serving.generative import GenerativeRevision
from serving.revision import PredictError

DEFAULT_MAX_TOKENS = 256
MAX_STOP = 4


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _text_content(content, i: int) -> str:
    """A message's content: a string, or OpenAI's list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise RequestError(
                    "only text content parts are supported", f"messages[{i}].content"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise RequestError("content must be a string or a list of text parts", f"messages[{i}]")


def parse_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError("each message must be an object", f"messages[{i}]")
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ROLES:
            raise RequestError(
                f"role must be system, user or assistant, not {m.get('role')!r}",
                f"messages[{i}].role",
            )
        out.append({"role": role, "content": _text_content(m.get("content"), i)})
    return out


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(f"{name} must be a number from {low:g} to {high:g}", name)
    return float(value)


def sampling(body: dict, prompt_tokens: int, context_length: int, limit: int) -> dict:
    """max_tokens, min_tokens, temperature, top_p, stop and seed of a request, checked;
    max_tokens (and min_tokens with it) capped
    by the endpoint's ``limit`` and the room the prompt leaves in the model's context."""
    room = context_length - prompt_tokens
    if room < 1:
        raise RequestError(
            f"the prompt has {prompt_tokens} tokens; this model's context is {context_length}",
            "messages",
            "context_length_exceeded",
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError("max_tokens must be a positive integer", "max_tokens")
    # Capped, not refused: the reply ends with finish_reason "length" at the cap.
    max_tokens = min(max_tokens, limit, room)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise RequestError(f"stop must be a string or a list of up to {MAX_STOP}", "stop")
    if body.get("n", 1) != 1:
        raise RequestError("n must be 1", "n")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("seed must be an integer", "seed")
    # vLLM's extension: no stop token before this many tokens (stop strings still end it).
    min_tokens = body.get("min_tokens", 0)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise RequestError("min_tokens must be a non-negative integer", "min_tokens")
    return {
        "max_tokens": max_tokens,
        "min_tokens": min(min_tokens, max_tokens),
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, 1e-6, 1.0),
        "stop": stop,
        "seed": seed,
    }


def _sse(data) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n"


async def complete(
    request: Request,
    body: dict,
    name: str,
    revision: GenerativeRevision,
    chat: bool,
    series,
    max_tokens: int,
    adapter: str = "",
) -> Response:
    """Generate for one chat or completions request (with ``adapter``, "" for none): one JSON
    answer, or an event stream; ``max_tokens``: the endpoint's cap on a reply."""
    started = time.perf_counter()
    tokenizer = revision.tokenizer
    assert tokenizer is not None  # set at load; only a ready revision is called
    try:
        # Rendering the model's chat template and tokenising are bounded but not instant: off
        # the event loop, so that one slow request does not hold up the others.
        prefix_tokens = 0
        if chat:
            messages = parse_messages(body)
            prompt_ids = await asyncio.to_thread(tokenizer.prompt_ids, messages)
            prefix_tokens = await asyncio.to_thread(revision.shared_prefix, messages, prompt_ids)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str) or not prompt:
                raise RequestError("prompt must be a non-empty string", "prompt")
            prompt_ids = await asyncio.to_thread(tokenizer.encode, prompt)
        params = sampling(body, len(prompt_ids), revision.context_length, max_tokens)
    except ChatTemplateError as exc:
        raise RequestError(str(exc), "messages") from None
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    generation = GenerationRequest(
        prompt_ids, **params, prefix_tokens=prefix_tokens, adapter=adapter
    )
    deltas = revision.stream(generation)
    created = int(time.time())
    kind = "chatcmpl" if chat else "cmpl"
    ident = f"{kind}-{uuid.uuid4().hex}"
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": 0, "total_tokens": 0}
    series.counts["inputs"] += 1
    series.counts["prompt_tokens"] += len(prompt_ids)

    def finish(completion_tokens: int, first_token_at: float | None) -> None:
        usage["completion_tokens"] = completion_tokens
        usage["total_tokens"] = len(prompt_ids) + completion_tokens
        series.counts["completion_tokens"] += completion_tokens
        series.observe((time.perf_counter() - started) * 1000)
        if first_token_at is not None:
            series.observe_ttft((first_token_at - started) * 1000)

    def choice(text: str, reason: str | None, streaming: bool) -> dict:
        if not chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        if streaming:
            return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": reason}
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }

    def envelope(choices: list, **extra) -> dict:
        obj = "chat.completion" if chat else "text_completion"
        if stream and chat:
            obj = "chat.completion.chunk"
        return {
            "id": ident,
            "object": obj,
            "created": created,
            "model": name,
            "system_fingerprint": revision.key,
            "choices": choices,
            **extra,
        }

    if not stream:
        text, reason, tokens, first = "", None, 0, None
        try:
            async for d in deltas:
                if first is None:
                    first = time.perf_counter()
                text += d.text
                reason, tokens = d.finish_reason, d.completion_tokens
        except PredictError as exc:
            series.counts["errors"] += 1
            raise RequestError(str(exc), None, "generation_failed") from None
        finally:
            await deltas.aclose()
        finish(tokens, first)
        return protocol.JSONResponse(
            envelope([choice(text, reason, False)], usage=usage),
            headers={"X-Revision": revision.key},
        )

    async def events() -> AsyncIterator[str]:
        first, tokens = None, 0
        if chat:
            opening = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            yield _sse(envelope([{**opening, "finish_reason": None}]))
        try:
            async for d in deltas:
                if first is None:
                    first = time.perf_counter()
                tokens = d.completion_tokens
                if d.text:
                    yield _sse(envelope([choice(d.text, None, True)]))
                if d.finish_reason:
                    yield _sse(envelope([choice("", d.finish_reason, True)]))
        except PredictError as exc:
            series.counts["errors"] += 1
            yield _sse({"error": {"message": str(exc), "type": "server_error", "code": None}})
            return
        finally:
            await deltas.aclose()  # a client gone mid-stream: its request leaves the batch
        finish(tokens, first)
        if include_usage:
            yield _sse(envelope([], usage=usage))
        yield _sse("[DONE]")

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"X-Revision": revision.key, "Cache-Control": "no-cache"},
    )


async def proxy(body: dict, path: str, name: str, revision, series) -> Response:
    """Pass a request to the revision's external engine (``engines.EngineRevision``) and its
    answer back, streamed or not, under the endpoint's name; tokens and time to first token
    are counted from what the engine reports."""
    import httpx

    started = time.perf_counter()
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=3.0))
    try:
        response = await client.send(
            client.build_request("POST", revision.url + path, json={**body, "model": revision.key}),
            stream=True,
        )
    except httpx.HTTPError as exc:
        await client.aclose()
        series.counts["errors"] += 1
        raise RequestError(
            f"the {revision.engine} engine is unreachable: {exc}", None, "generation_failed"
        ) from None
    series.counts["inputs"] += 1

    def account(event: dict) -> None:
        usage = event.get("usage") or {}
        series.counts["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
        series.counts["completion_tokens"] += int(usage.get("completion_tokens") or 0)

    if not body.get("stream"):
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
            await client.aclose()
        try:
            data = json.loads(raw)
        except ValueError:
            data = {
                "error": {"message": raw[:500].decode(errors="replace"), "type": "server_error"}
            }
        if isinstance(data, dict) and "model" in data:
            data["model"] = name
            account(data)
        series.observe((time.perf_counter() - started) * 1000)
        return protocol.JSONResponse(
            data, response.status_code, headers={"X-Revision": revision.key}
        )

    async def events() -> AsyncIterator[str]:
        first = None
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line.strip() == "data: [DONE]":
                    yield _sse("[DONE]")
                    continue
                event = json.loads(line[6:])
                if isinstance(event, dict):
                    event["model"] = name if "model" in event else event.get("model")
                    choices = event.get("choices") or []
                    if first is None and choices and (choices[0].get("delta") or {}).get("content"):
                        first = time.perf_counter()
                    account(event)
                yield _sse(event)
        finally:
            await response.aclose()
            await client.aclose()
            series.observe((time.perf_counter() - started) * 1000)
            if first is not None:
                series.observe_ttft((first - started) * 1000)

    return StreamingResponse(
        events(),
        status_code=response.status_code,
        media_type="text/event-stream",
        headers={"X-Revision": revision.key, "Cache-Control": "no-cache"},
    )
