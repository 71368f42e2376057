"""Generation speed: one exported causal LM, in one run, generating for 8 concurrent requests

    .venv/bin/python benchmarks/generation.py  # [--rounds N] [--max-tokens T] [--no-adapters]
                                               # [--smoke]

(a) bare: ``runtime.generation.Generator`` in a process of its own (the runtime venv) on one
    batch of the 8 prompts, one math thread as the host's generation process has: the limit;
(b) endpoint: the serving host (``python -m serving``) with one revision of one
    generation process (max_batch_size 8, max_wait_ms 20), called over HTTP by 8 concurrent
    clients, each streaming one chat completion (``"stream": true``) of the same prompts.

Both generate the same tokens: temperature 0, the same prompts and ``max_tokens``, and the
model is trained for one epoch only, so that it rarely ends a reply before its token limit
(each request of (b) still ends on its own stop, as in (a)). The model is the LLaMA
architecture at a size where a step costs what it costs on a real model's small end (hidden
256, 4 layers, a character vocabulary), fine-tuned on sums in words by the real job runner.

Rounds alternate (a) and (b), so that other work on the machine weighs on both alike; the
figures are medians over rounds. Tokens/s count the completion tokens of the 8 requests over
the wall time from the first request to the last token; time to first token runs from a
client's sending its request to reading the first content chunk.

Then continuous against static batching (issue #22), on the same host and model: 16 clients,
each sending requests one after another (a closed loop) with prompts of several lengths and
``max_tokens`` from 8 to 128 and ``min_tokens`` as much (every reply runs to its limit, so
output lengths are the mix's, whatever the model would answer),
against a revision with continuous batching (the engine: a request joins the running batch at
the next step) and one with ``"batching": "static"`` (the engine before it: a batch is taken
when the last one is done), max_batch_size 16 both; rounds alternate them. Tokens/s count every
completion token over the round's wall time; time to first token runs from sending a request
to its first content chunk, queueing included.

Then many adapters on one base (issue #22): a base model of the LLaMA architecture (hidden 512,
8 layers: 25 M parameters, 100 MB in float32) and nine LoRA versions of it trained by the job
runner (rank 8 on every linear layer, one epoch each, each on its own seed and rows). The
memory of a generation process (its resident set once it has generated, in a process of its
own, the runtime venv) serving one merged version against the same process serving that
version with the eight others loaded as adapters (``runtime.adapters``) and generating for
eight requests, one per adapter, in one batch; rounds alternate the two, medians.

Aims: endpoint / bare ≥ 0.7; continuous ≥ 2× static tokens/s with a lower TTFT; 8 adapters at
most 1.3× the memory of one merged model. Ends with one JSON line: bare_tokens_per_s,
endpoint_tokens_per_s, ratio, ttft_p50_ms, continuous_tokens_per_s, static_tokens_per_s,
continuous_vs_static, ttft_p50_ms_continuous, ttft_p50_ms_static, merged_rss_mb,
adapters_8_rss_mb, adapters_8_rss_ratio.
"""

import argparse
import http.client
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from _harness import (
    Host,
    parse,
    print_result,
    run_job,
    runtime_env,
    runtime_python,
    start_bare,
    stop,
    write_splits,
)

CLIENTS = 8
ARCH = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 688,
}
QUESTIONS = [
    f"请问{a}加{b}等于几？请写出计算过程。" for a, b in ((1, 2), (3, 4), (5, 6), (7, 8))
] * 2

# The bare engine, in the runtime venv: argv = export dir, max_tokens. Prints "ready", then
# per line on stdin one JSON line: the tokens/s of generating for the batch of prompts.
BARE = r"""
import json, sys, time
from pathlib import Path
from runtime.generation import Generator, GenerationRequest
g = Generator(Path(sys.argv[1]))
questions = json.loads(sys.argv[3])
def batch():
    return [GenerationRequest(g.chat_prompt([{"role": "user", "content": q}]),
            max_tokens=int(sys.argv[2]), temperature=0) for q in questions]
g.generate(batch())  # warm-up
print("ready", flush=True)
for _ in sys.stdin:
    started = time.perf_counter()
    texts = g.generate(batch())
    elapsed = time.perf_counter() - started
    tokens = sum(len(g.tokenizer.encode(t)) for t in texts)
    print(json.dumps({"tokens": tokens, "seconds": elapsed}), flush=True)
"""


def train(workdir: Path, rows: int) -> Path:
    """The LLaMA architecture at ARCH's size, fine-tuned (LoRA) for one epoch on ``rows`` sums
    (81 at most; the last ninth of them the dev split)."""
    from runtime.presets import recommended
    from runtime.spec import JobSpec

    data = [
        {
            "messages": [
                {"role": "user", "content": f"请问{a}加{b}等于几？请写出计算过程。"},
                {"role": "assistant", "content": f"{a}加{b}，先数{a}个，再数{b}个，等于{a + b}。"},
            ]
        }
        for a in range(1, 10)
        for b in range(1, 10)
    ][:rows]
    cut = len(data) * 8 // 9
    write_splits(workdir, {"train": data[:cut], "dev": data[cut:]})
    hp = recommended("instruction", preset="llama-tiny-char")
    hp.epochs, hp.eval_generations, hp.checkpoint_steps = 1, 0, 0
    JobSpec(
        job_id=1,
        task_kind="instruction",
        labels=[],
        preset="llama-tiny-char",
        model_config=ARCH,
        hyperparameters=hp,
    ).save(workdir)
    return run_job(workdir)


class BareGenerator:
    """The bare engine's process, generating for the batch of prompts on demand."""

    def __init__(self, export: Path, max_tokens: int, log: Path) -> None:
        questions = json.dumps(QUESTIONS, ensure_ascii=False)
        args = [str(export), str(max_tokens), questions]
        self.proc = start_bare(BARE, args, log, "bare engine")

    def measure(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        return result["tokens"] / result["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        stop(self.proc)


def stream_one(
    port: int, api_key: str, question: str, max_tokens: int, out: dict, min_tokens: int = 0
) -> None:
    """One streamed chat completion: the time of its first content chunk, its tokens."""
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "min_tokens": min_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        ensure_ascii=False,
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = time.perf_counter()
    conn.request(
        "POST",
        "/v1/chat/completions",
        body,
        {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    if response.status != 200:
        sys.exit(f"the endpoint answered {response.status}: {response.read()[:500]!r}")
    first = None
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            out["tokens"] = event["usage"]["completion_tokens"]
        elif first is None and event["choices"] and event["choices"][0]["delta"].get("content"):
            first = time.perf_counter()
    out["ttft_ms"] = (first - sent) * 1000 if first else None
    out["done"] = time.perf_counter()
    conn.close()


def timed_round(threads: list[threading.Thread], outs: list[dict]) -> tuple[float, list[float]]:
    """Run the clients' threads, which fill ``outs`` (stream_one's): the tokens/s of the round
    (to its last answer) and each request's time to first token."""
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = max(o["done"] for o in outs) - started
    return sum(o["tokens"] for o in outs) / elapsed, [o["ttft_ms"] for o in outs if o["ttft_ms"]]


def endpoint_round(port: int, api_key: str, max_tokens: int) -> tuple[float, list[float]]:
    outs: list[dict] = [{} for _ in QUESTIONS]
    threads = [
        threading.Thread(target=stream_one, args=(port, api_key, q, max_tokens, o))
        for q, o in zip(QUESTIONS, outs, strict=True)
    ]
    return timed_round(threads, outs)


# The mixed load: each client's requests, (question, max_tokens), in its own order.
MIXED_QUESTIONS = ["1加2？", "请问3加4等于几？", "请问5加6等于几？请写出计算过程。", "7加8等于几？"]
MIXED_TOKENS = (8, 128, 16, 64, 32, 96)


def mixed_round(port: int, api_key: str, clients: int, per_client: int, scale: float):
    """``clients`` closed-loop clients, ``per_client`` requests each: tokens/s over the round,
    and every request's time to first token."""
    outs: list[dict] = []

    def client(i: int) -> None:
        for j in range(per_client):
            question = MIXED_QUESTIONS[(i + j) % len(MIXED_QUESTIONS)]
            tokens = max(1, int(MIXED_TOKENS[(i * 5 + j) % len(MIXED_TOKENS)] * scale))
            out: dict = {}
            # Every reply runs to its limit (min_tokens): the output lengths are the mix's,
            # whatever the model would answer.
            stream_one(port, api_key, question, tokens, out, min_tokens=tokens)
            outs.append(out)

    return timed_round([threading.Thread(target=client, args=(i,)) for i in range(clients)], outs)


def continuous_against_static(host: Host, export: Path, args) -> dict:
    keys = {}
    for mode in ("continuous", "static"):
        host.load(f"rev-{mode}", export, max_batch_size=16, max_wait_ms=20, batching=mode)
        keys[mode] = "mpe_" + secrets.token_urlsafe(24)
    rates: dict[str, list[float]] = {"continuous": [], "static": []}
    ttfts: dict[str, list[float]] = {"continuous": [], "static": []}
    for i in range(args.rounds + 1):  # the first round warms both up
        for mode in ("continuous", "static"):
            host.route(f"rev-{mode}", keys[mode])
            rate, ttft = mixed_round(
                host.port, keys[mode], args.clients, args.per_client, args.token_scale
            )
            if i:
                rates[mode].append(rate)
                ttfts[mode] += ttft
        if i:
            print(
                f"mixed round {i}: continuous {rates['continuous'][-1]:.1f} tokens/s, static "
                f"{rates['static'][-1]:.1f} tokens/s",
                flush=True,
            )
    continuous, static = (statistics.median(rates[m]) for m in ("continuous", "static"))
    return {
        "continuous_tokens_per_s": round(continuous, 1),
        "static_tokens_per_s": round(static, 1),
        "continuous_vs_static": round(continuous / static, 3),
        "ttft_p50_ms_continuous": round(statistics.median(ttfts["continuous"]), 1),
        "ttft_p50_ms_static": round(statistics.median(ttfts["static"]), 1),
    }


ADAPTER_ARCH = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 1376,
}
ADAPTERS = 8
# A base model at ADAPTER_ARCH's size (argv: directory, architecture as JSON), as the import
# leaves one: safetensors, a character tokenizer with the ChatML template.
MAKE_BASE = r"""
import json, pathlib, sys
from runtime.chat import build_char_tokenizer
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM
d = pathlib.Path(sys.argv[1])
tok = build_char_tokenizer(["请问等于几？写出计算过程，先数个再加0123456789。"], d)
config = LlamaConfig(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                     max_position_embeddings=512, use_flash_attention=False,
                     **json.loads(sys.argv[2]))
LlamaForCausalLM(config).save_pretrained(str(d), safe_serialization=True)
"""
# A generation process's memory (argv: the served export, then the adapters' exports): the
# model, the adapters loaded, one batch of 8 requests (one per adapter) generated; prints
# its resident set in MB.
MEMORY = r"""
import sys
from pathlib import Path
from runtime.generation import Generator, GenerationRequest
g = Generator(Path(sys.argv[1]))
names = []
for i, export in enumerate(sys.argv[2:]):
    g.load_adapter(f"a{i}", Path(export) / "adapter")
    names.append(f"a{i}")
prompt = g.chat_prompt([{"role": "user", "content": "请问3加4等于几？"}])
g.generate([GenerationRequest(prompt, max_tokens=8, temperature=0,
                              adapter=names[i % len(names)] if names else "")
            for i in range(8)])
rss = next(l for l in open("/proc/self/status") if l.startswith("VmRSS:"))
print(int(rss.split()[1]) / 1024)
"""


def adapters_memory(tmp: Path, args) -> dict:
    """The resident set of one merged LoRA version against it with 8 adapters loaded."""
    import subprocess

    base = tmp / "base"
    # Smoke: a tiny base, one version, its own adapter loaded over it.
    smoke = os.environ.get("BENCH_SMOKE") == "1"
    arch = {**ADAPTER_ARCH, **({"hidden_size": 64, "intermediate_size": 172} if smoke else {})}
    count = 0 if smoke else ADAPTERS
    subprocess.run(
        [runtime_python(), "-c", MAKE_BASE, str(base), json.dumps(arch)],
        env=runtime_env(),
        check=True,
        capture_output=True,
    )
    exports = []
    for i in range(count + 1):
        print(f"training LoRA version {i + 1} of {count + 1} of one base …", flush=True)
        exports.append(train_lora(tmp / f"lora-{i}", base, i, args.rows))

    def rss(extra: list[Path]) -> float:
        out = subprocess.run(
            [runtime_python(), "-c", MEMORY, str(exports[0]), *map(str, extra)],
            env=runtime_env(OMP_NUM_THREADS="1"),
            check=True,
            capture_output=True,
            text=True,
        )
        return float(out.stdout.strip().splitlines()[-1])

    merged, adapted = [], []
    adapters = exports[1:] or exports[:1]
    for i in range(max(1, args.rounds // 2)):
        merged.append(rss([]))
        adapted.append(rss(adapters))
        print(
            f"memory round {i + 1}: one merged model {merged[-1]:.0f} MB, with "
            f"{len(adapters)} adapters {adapted[-1]:.0f} MB",
            flush=True,
        )
    one, many = statistics.median(merged), statistics.median(adapted)
    return {
        "merged_rss_mb": round(one, 1),
        "adapters_8_rss_mb": round(many, 1),
        "adapters_8_rss_ratio": round(many / one, 3),
    }


def train_lora(workdir: Path, base: Path, seed: int, rows: int) -> Path:
    """A LoRA version of ``base``: one epoch on ``rows`` sums, shuffled by ``seed``."""
    import random

    from runtime.spec import Hyperparameters, JobSpec

    data = [
        {
            "messages": [
                {"role": "user", "content": f"请问{a}加{b}等于几？"},
                {"role": "assistant", "content": f"先数{a}个，再数{b}个，等于{a + b}。"},
            ]
        }
        for a in range(1, 10)
        for b in range(1, 10)
    ]
    random.Random(seed).shuffle(data)  # noqa: S311 - which rows, not a secret
    data = data[: max(rows, 9)]
    cut = len(data) * 8 // 9
    write_splits(workdir, {"train": data[:cut], "dev": data[cut:]})
    hp = Hyperparameters(
        epochs=1,
        batch_size=8,
        learning_rate=1e-3,
        max_seq_length=64,
        checkpoint_steps=0,
        eval_generations=0,
        method="lora",
        seed=seed,
    )
    JobSpec(
        job_id=1,
        task_kind="instruction",
        labels=[],
        base_model_dir=str(base),
        hyperparameters=hp,
    ).save(workdir)
    return run_job(workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=81, help="training rows (sums), 81 at most")
    parser.add_argument("--clients", type=int, default=16, help="of the mixed load")
    parser.add_argument("--per-client", type=int, default=6, help="requests of each client")
    parser.add_argument("--token-scale", type=float, default=1.0, help="× the max_tokens mix")
    parser.add_argument(
        "--no-adapters", action="store_true", help="leave the adapters' memory out (minutes)"
    )
    # --smoke: one step of training, one round of a few tokens.
    args = parse(
        parser,
        smoke={
            "rounds": 1,
            "max_tokens": 4,
            "rows": 5,
            "clients": 4,
            "per_client": 2,
            "token_scale": 0.1,
        },
    )
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        tmp = Path(tmp)
        print("training the model (LLaMA architecture, hidden 256, 4 layers) …", flush=True)
        export = train(tmp / "job", args.rows)
        bare = BareGenerator(export, args.max_tokens, tmp / "bare.log")
        host = Host(tmp / "host.log")
        try:
            host.load("rev-bench", export, max_batch_size=CLIENTS, max_wait_ms=20)
            api_key = "mpe_" + secrets.token_urlsafe(24)
            host.route("rev-bench", api_key)
            endpoint_round(host.port, api_key, args.max_tokens)  # warm-up
            bare_rates, endpoint_rates, ttfts = [], [], []
            for i in range(args.rounds):
                bare_rates.append(bare.measure())
                rate, ttft = endpoint_round(host.port, api_key, args.max_tokens)
                endpoint_rates.append(rate)
                ttfts += ttft
                print(
                    f"round {i + 1}: bare {bare_rates[-1]:.1f} tokens/s, endpoint {rate:.1f} "
                    f"tokens/s, TTFT p50 {statistics.median(ttft):.1f} ms",
                    flush=True,
                )
            described = host.manage("GET", "/manage/state")["revisions"]["rev-bench"]
            print(
                f"the endpoint generated {described['batched_inputs']} requests in "
                f"{described['batches']} admissions",
                flush=True,
            )
            host.manage("DELETE", "/manage/revisions/rev-bench")
            mixed = continuous_against_static(host, export, args)
        finally:
            bare.close()
            host.stop()
        memory = {} if args.no_adapters else adapters_memory(tmp, args)
    bare_rate = statistics.median(bare_rates)
    endpoint_rate = statistics.median(endpoint_rates)
    print_result(
        {
            "bare_tokens_per_s": round(bare_rate, 1),
            "endpoint_tokens_per_s": round(endpoint_rate, 1),
            "ratio": round(endpoint_rate / bare_rate, 3),
            "ttft_p50_ms": round(statistics.median(ttfts), 1),
            **mixed,
            **memory,
        }
    )


if __name__ == "__main__":
    main()
