"""Continuous batching in the generation engine (``runtime.generation.Batch``), on a causal LM
trained by the job runner on each backend: requests that join a running batch at later steps,
with prompts of other lengths and other token limits, generate exactly what each generates
alone, and a request that is done leaves the batch at once."""

from pathlib import Path

import pytest

from runtime.generation import GenerationRequest, Generator
from tests.helpers.workdir import run_quietly
from tests.runtime.test_llm_runner import workdir

QUESTIONS = ["1加2等于几？", "请问3加4等于几？请写出计算过程。", "5加6？", "7加8等于几？"]


@pytest.fixture(scope="module", params=["paddle", "torch"])
def generator(request, tmp_path_factory) -> Generator:
    directory = workdir(
        tmp_path_factory.mktemp(request.param), request.param, epochs=2, eval_generations=0
    )
    run_quietly(directory)
    return Generator(Path(directory) / "export")


def test_requests_join_a_running_batch_and_each_generates_as_it_would_alone(generator):
    g = generator
    requests = [
        GenerationRequest(
            g.chat_prompt([{"role": "user", "content": q}]),
            max_tokens=limit,
            temperature=0,
            id=i,
        )
        for i, (q, limit) in enumerate(zip(QUESTIONS, (12, 6, 16, 3), strict=True))
    ]

    def run(joins: dict[int, list[GenerationRequest]]) -> tuple[dict[int, str], list[int]]:
        """Requests joining one batch at the steps given; their texts and the batch's size at
        each step. No stop token: each runs to its limit, so who is in the batch is known."""
        batch = g.batch()
        batch.stop_ids = set()
        texts = {r.id: "" for group in joins.values() for r in group}
        sizes, step = [], 0
        while len(batch) or step <= max(joins):
            if step in joins:
                batch.add(joins[step])
            sizes.append(len(batch))
            for delta in batch.step():
                texts[delta.id] += delta.text
            step += 1
        return texts, sizes

    alone = [run({0: [r]})[0][r.id] for r in requests]
    assert any(len(set(text)) > 2 for text in alone)  # it generates something to compare
    # Two start; the third joins at step 2, the fourth at step 4.
    texts, sizes = run({0: requests[:2], 2: requests[2:3], 4: requests[3:]})
    assert [texts[r.id] for r in requests] == alone
    # Each left at its limit (12, 6, 16, 3 tokens): the batch shrank as they did.
    assert sizes == [2, 2, 3, 3, 4, 4, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1]


def test_a_request_takes_the_slot_of_one_that_is_done_and_generates_as_alone(generator):
    """Continuous batching keeps a finished row's slot (its cache masked) for the next request:
    a request that joins then is written into it, left-padded to the batch's columns, and one
    longer than the batch's columns is appended; each generates what it does alone."""
    g = generator

    def request(i: int, q: str, limit: int) -> GenerationRequest:
        prompt = g.chat_prompt([{"role": "user", "content": q}])
        return GenerationRequest(prompt, max_tokens=limit, temperature=0, id=i)

    long_question = "请问" + "，".join(QUESTIONS) + "这些都等于几？"
    plan = {
        0: [
            request(0, QUESTIONS[1], 14),
            request(1, QUESTIONS[2], 3),
            request(2, QUESTIONS[0], 14),
        ],
        5: [request(3, QUESTIONS[3], 6)],  # into the slot of request 1 (done at step 3)
        7: [request(4, long_question, 4)],  # longer than the batch's columns: appended
    }
    alone = {}
    for group in plan.values():
        for r in group:
            batch = g.batch()
            batch.stop_ids = set()
            batch.add([r])
            text = ""
            while len(batch):
                text += "".join(d.text for d in batch.step())
            alone[r.id] = text
    batch = g.batch()
    batch.stop_ids = set()
    texts = dict.fromkeys(alone, "")
    rows, step = [], 0
    while len(batch) or step <= max(plan):
        if step in plan:
            batch.add(plan[step])
        rows.append(len(batch.streams))
        for delta in batch.step():
            texts[delta.id] += delta.text
        step += 1
    assert texts == alone
    assert rows[5] == 3  # request 3 took request 1's slot: no new row
    assert max(rows) == 4  # the long one was appended


def test_min_tokens_keeps_a_reply_going_past_its_stop_token(generator):
    g = generator
    prompt = g.chat_prompt([{"role": "user", "content": QUESTIONS[0]}])

    def reply(**limits) -> tuple[str | None, int]:
        batch = g.batch()
        stream = batch.add([GenerationRequest(prompt, temperature=0, **limits)])[0]
        while len(batch):
            batch.step()
        return stream.finish, len(stream.ids)

    finish, tokens = reply(max_tokens=60)
    assert finish == "stop" and tokens < 50  # the model answers, and ends its answer
    assert reply(max_tokens=60, min_tokens=60) == ("length", 60)
    assert reply(max_tokens=60, min_tokens=tokens + 5)[1] >= tokens + 5


def test_a_cancelled_request_leaves_at_the_next_step_and_the_others_go_on(generator):
    g = generator
    requests = [
        GenerationRequest(
            g.chat_prompt([{"role": "user", "content": q}]), max_tokens=8, temperature=0, id=i
        )
        for i, q in enumerate(QUESTIONS[:2])
    ]
    batch = g.batch()
    batch.stop_ids = set()
    batch.add(requests)
    texts = {0: "", 1: ""}
    for _ in range(2):
        for delta in batch.step():
            texts[delta.id] += delta.text
    batch.cancel({0})
    after = batch.step()
    assert len(batch) == 1 and {d.id for d in after} <= {1}
    for delta in after:
        texts[delta.id] += delta.text
    while len(batch):
        for delta in batch.step():
            texts[delta.id] += delta.text
    alone = g.batch()
    alone.stop_ids = set()
    alone.add([requests[1]])
    expected = ""
    while len(alone):
        expected += "".join(d.text for d in alone.step())
    assert texts[1] == expected


def test_static_batching_keeps_the_rows_that_are_done_until_all_are(generator):
    """The engine before continuous batching, kept as the benchmark's baseline."""
    g = generator
    requests = [
        GenerationRequest(
            g.chat_prompt([{"role": "user", "content": q}]), max_tokens=n, temperature=0, id=i
        )
        for i, (q, n) in enumerate(zip(QUESTIONS[:2], (3, 7), strict=True))
    ]
    texts: dict[int, str] = {0: "", 1: ""}
    for static in (False, True):
        batch = g.batch(static)
        batch.stop_ids = set()
        batch.add(requests)
        sizes = []
        while len(batch):
            sizes.append(len(batch))
            for delta in batch.step():
                texts[delta.id] += delta.text
        assert sizes == ([2] * 7 if static else [2, 2, 2, 1, 1, 1, 1])
    first, second = texts.values()  # each request's text twice: the same both ways
    assert first[: len(first) // 2] == first[len(first) // 2 :]
    assert second[: len(second) // 2] == second[len(second) // 2 :]


def test_a_shared_system_prompt_is_prefilled_once_and_generates_the_same(generator):
    g = generator
    system = {"role": "system", "content": "你是一个会算加法的助手，请用一句话回答每个问题。"}
    prompts = [g.chat_prompt([system, {"role": "user", "content": q}]) for q in QUESTIONS]
    alone = g.chat_prompt([system])  # the system turn alone: a prefix of each prompt
    shared = next(i for i in range(len(alone)) if alone[i] != prompts[0][i])
    assert shared >= 16

    def run(prefix_tokens: int, batch) -> list[str]:
        texts = {}
        for i, p in enumerate(prompts):  # one at a time: each joins the running batch
            r = GenerationRequest(p, max_tokens=6, temperature=0, id=i)
            r.prefix_tokens = prefix_tokens
            batch.add([r])
            texts[i] = ""
            for delta in batch.step():
                texts[delta.id] += delta.text
        while len(batch):
            for delta in batch.step():
                texts[delta.id] += delta.text
        return [texts[i] for i in range(len(prompts))]

    batch = g.batch()
    batch.stop_ids = set()
    cached = run(shared, batch)
    assert batch.prefix_hits == len(prompts) - 1 and len(batch.prefixes) == 1
    plain = g.batch()
    plain.stop_ids = set()
    assert cached == run(0, plain) and plain.prefix_hits == 0


def test_paddle_fast_paths_compute_what_paddlenlps_own_code_does(generator):
    """The served PaddleNLP model's fast paths (``_fast_paths``: attention by einsum, RMSNorm
    and rotary embedding without broadcasting, several times faster on a CPU) give PaddleNLP's
    own logits: a left-padded prefill, then decoding steps on its cache."""
    import sys

    import numpy as np

    from runtime.generation import RMS_NORMS, position_ids

    if generator.manifest["runtime"] != "paddle_generate":
        pytest.skip("PaddleNLP's code: the paddle backend's")
    model = generator.lm.model
    layers = [
        layer
        for layer in model.sublayers()
        if hasattr(getattr(layer, "attn_func", None), "original")
    ]
    norms = [layer for layer in model.sublayers() if type(layer).__name__ in RMS_NORMS]
    module = sys.modules[type(model).__module__]
    # Every attention layer and norm of the export runs its fast path, and the module's rotary.
    assert layers and norms and all("forward" in vars(n) for n in norms)
    assert hasattr(module.apply_rotary_pos_emb, "original")
    prompts = [generator.chat_prompt([{"role": "user", "content": q}]) for q in QUESTIONS[:3]]
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), "int64")
    mask = np.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = p, 1

    def logits() -> list[np.ndarray]:
        out, cache = generator.lm.forward(ids, mask, position_ids(mask), None)
        steps, m, positions = [out], mask, position_ids(mask)[:, -1:]
        for _ in range(3):
            m = np.concatenate([m, np.ones((len(prompts), 1), "int64")], axis=1)
            positions = positions + 1
            tokens = steps[-1].argmax(axis=1)[:, None]
            out, cache = generator.lm.forward(tokens, m, positions, cache)
            steps.append(out)
        return steps

    fast = logits()
    patched = {layer: layer.attn_func for layer in layers}
    norm_paths = {norm: norm.forward for norm in norms}
    rotary = module.apply_rotary_pos_emb
    try:
        for layer in layers:
            layer.attn_func = layer.attn_func.original
        for norm in norms:
            del norm.forward  # the class's own
        module.apply_rotary_pos_emb = rotary.original
        own = logits()
    finally:
        for layer, func in patched.items():
            layer.attn_func = func
        for norm, forward in norm_paths.items():
            norm.forward = forward
        module.apply_rotary_pos_emb = rotary
    for a, b in zip(fast, own, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
