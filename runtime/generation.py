"""Generation from an exported causal LM (runtimes ``paddle_generate`` and ``torch_generate``):
the one engine that the serving host's replicas, the evaluation and the benchmark run.

A batch of requests is generated together (static batching): the prompts are left-padded and
prefilled once, then each step decodes one token for every row with the key/value cache, and
each request ends on its own (a stop token, one of its stop strings, or its token limit) while
the others go on. Each step reports what every request's text grew by, so the caller can
stream it. Sampling is per request (temperature, top-p, seed); temperature 0 is greedy.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtime.chat import ChatTokenizer
from runtime.inference import read_manifest
from runtime.weights import refuse_pickles

RUNTIMES = ("paddle_generate", "torch_generate")


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    id: int = 0


@dataclass
class Delta:
    """What a request's completion grew by in one step; ``finish_reason`` on its last."""

    id: int
    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0


def position_ids(mask: np.ndarray) -> np.ndarray:
    """Positions that skip left padding, so a padded prompt generates as it would alone."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype("int64")


def sample(logits: np.ndarray, temperature: float, top_p: float, rng) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype("float64") / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return int(rng.choice(len(p), p=p))


class _Stream:
    """One request in a batch: its tokens, and the text sent so far (held back while it may
    still end in a stop string or in half a character)."""

    def __init__(self, request: GenerationRequest, tokenizer: ChatTokenizer) -> None:
        self.request = request
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0
        self.finish: str | None = None
        self.rng = np.random.default_rng(request.seed)
        self.hold = max((len(s) for s in request.stop), default=1) - 1

    def add(self, token: int, stop_ids: set[int]) -> Delta:
        if token in stop_ids:
            self.finish = "stop"
        else:
            self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        for s in self.request.stop:
            found = text.find(s, max(0, self.sent - len(s)))
            if found != -1:
                text, self.finish = text[:found], "stop"
        if self.finish is None and len(self.ids) >= self.request.max_tokens:
            self.finish = "length"
        if self.finish is None:
            end = len(text) - self.hold
            if text.endswith("\ufffd"):  # a character whose bytes are not all out yet
                end = min(end, len(text) - 1)
        else:
            end = len(text)
        piece = text[self.sent : max(end, self.sent)]
        self.sent += len(piece)
        return Delta(self.request.id, piece, self.finish, len(self.ids))


class Generator:
    def __init__(self, export_dir: Path, device: str = "cpu", verify: bool = True) -> None:
        export_dir = Path(export_dir)
        self.manifest = read_manifest(export_dir, verify=verify)
        runtime = self.manifest.get("runtime")
        if runtime not in RUNTIMES:
            raise ValueError(f"{export_dir} is not a generative model (runtime {runtime!r})")
        self.tokenizer = ChatTokenizer(export_dir)
        config = json.loads((export_dir / "config.json").read_text("utf-8"))
        self.context_length = int(
            config.get("max_position_embeddings") or self.manifest.get("max_length") or 2048
        )
        lm = PaddleLM if runtime == "paddle_generate" else TorchLM
        self.lm = lm.load(export_dir, device)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.prompt_ids(messages)

    def generate(
        self,
        requests: list[GenerationRequest],
        on_step: Callable[[list[Delta]], None] | None = None,
    ) -> list[str]:
        return generate(self.lm, self.tokenizer, requests, on_step)


def generate(
    lm, tokenizer: ChatTokenizer, requests: list[GenerationRequest], on_step=None
) -> list[str]:
    """Generate for every request together with ``lm`` (``forward(ids, mask, positions,
    cache) → (last logits, cache)``); ``on_step`` gets each step's deltas. Returns the
    completions."""
    stop_ids = set(tokenizer.stop_ids)
    streams = [_Stream(r, tokenizer) for r in requests]
    width = max(len(r.prompt_ids) for r in requests)
    pad = tokenizer.pad_id
    ids = np.full((len(requests), width), pad, dtype="int64")
    mask = np.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = r.prompt_ids
        mask[i, width - len(r.prompt_ids) :] = 1
    positions = position_ids(mask)
    logits, cache = lm.forward(ids, mask, positions, None)
    texts = [""] * len(requests)
    for _ in range(max(r.max_tokens for r in requests)):
        tokens = np.full(len(requests), pad, dtype="int64")
        deltas = []
        for i, s in enumerate(streams):
            if s.finish is not None:
                continue
            tokens[i] = sample(logits[i], s.request.temperature, s.request.top_p, s.rng)
            delta = s.add(int(tokens[i]), stop_ids)
            texts[i] += delta.text
            if delta.text or delta.finish_reason:
                deltas.append(delta)
        if on_step is not None and deltas:
            on_step(deltas)
        if all(s.finish is not None for s in streams):
            break
        mask = np.concatenate([mask, np.ones((len(requests), 1), "int64")], axis=1)
        positions = positions[:, -1:] + 1
        logits, cache = lm.forward(tokens[:, None], mask, positions, cache)
    return texts


class TorchLM:
    """A transformers causal LM (or a peft-wrapped one, in training) as the engine runs it."""

    def __init__(self, model, device) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.device = device
        self.model.eval()

    @classmethod
    def load(cls, export_dir: Path, device: str) -> "TorchLM":
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM

        refuse_pickles(export_dir)
        target = torch.device("cuda" if device.startswith("gpu") else "cpu")
        model = AutoModelForCausalLM.from_pretrained(
            str(export_dir), torch_dtype=torch.float32, local_files_only=True, use_safetensors=True
        ).to(target)
        return cls(model, target)

    def forward(self, ids, mask, positions, cache):
        torch = self.torch

        def tensor(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

        with torch.inference_mode():
            out = self.model(
                input_ids=tensor(ids),
                attention_mask=tensor(mask),
                position_ids=tensor(positions),
                past_key_values=cache,
                use_cache=True,
            )
        return out.logits[:, -1].float().cpu().numpy(), out.past_key_values


class PaddleLM:
    """A PaddleNLP causal LM (or a LoRA-wrapped one, in training) as the engine runs it."""

    def __init__(self, model) -> None:
        import paddle

        self.paddle = paddle
        self.model = model
        self.model.eval()

    @classmethod
    def load(cls, export_dir: Path, device: str) -> "PaddleLM":
        import paddle
        from paddlenlp.transformers import AutoModelForCausalLM
        from paddlenlp.utils.log import logger

        logger.set_level("WARNING")
        paddle.set_device("gpu:0" if device.startswith("gpu") else "cpu")
        refuse_pickles(export_dir)
        # Safetensors only: a pickled model_state.pdparams is never loaded (it could run code).
        model = AutoModelForCausalLM.from_pretrained(
            str(export_dir), dtype="float32", use_safetensors=True
        )
        return cls(model)

    def forward(self, ids, mask, positions, cache):
        paddle = self.paddle
        with paddle.no_grad():
            out = self.model(
                input_ids=paddle.to_tensor(ids),
                attention_mask=paddle.to_tensor(mask),
                position_ids=paddle.to_tensor(positions),
                past_key_values=cache,
                use_cache=True,
                return_dict=True,
            )
        return out.logits[:, -1].astype("float32").numpy(), out.past_key_values
