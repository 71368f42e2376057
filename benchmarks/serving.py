"""Serving speed: one exported model served three ways in one run, on the same texts.

    .venv/bin/python benchmarks/serving.py   # [--seconds S] [--rounds N] [--smoke]

(a) bare: ``runtime.inference.Predictor`` in a process of its own (the runtime venv, where
    Paddle is) predicting the texts at batch sizes 1…64, one batch after another; the best
    batch size's samples/s is the limit.
(b) endpoint: the serving host (``python -m serving``) with one revision of ONE
    replica, max_batch_size 32 and max_wait_ms 2, called over HTTP by 64 concurrent clients
    (twice the batch: below), each sending one text per request (``{"inputs": [text]}``) on a
    keep-alive connection and the next as soon as it is answered.
(c) unbatched: the same host and load, the revision loaded with max_batch_size 1 and
    max_wait_ms 0 (a batch of one per request, as a server without a batcher runs).

One replica is one predictor process with one math thread, and the bare predictor runs with
one thread too (``Predictor.load`` sets it on a CPU), so (a), (b) and (c) have the same
compute; what (b) adds is HTTP, JSON, the batcher and the pipe to the predictor process, and
they share the machine's other cores with the clients. The model is ``ernie-micro-char``
trained for text classification by the real job runner (``python -m runtime.run``, as
tests/deployment/fixtures.py trains one) on reviews of 20–60 characters, max_seq_length 128
(batches are padded to their longest text, so to about 60).

Other work on the machine, and the machine itself (a VM's CPU runs ±15 % faster or slower from
one second to the next), moves both sides, so (a) at its best batch size and (b) are measured
in alternating windows (``--rounds``) and compared over the same stretch of time; each round
also measures (a) at the endpoint's mean batch size, to tell the server's own cost from the
batch sizes its load allowed. (c) is measured once, after them. Samples/s count the answers
completed in a window (after a warm-up); latency runs from sending a request to reading its
whole answer. The clients are threads with raw keep-alive sockets and prepared request bytes,
cheap per request, so that they take little of the CPU the host needs. Each window's line
shows the CPU share of each process: the predictor's, how long it waited for a CPU, the host's
(the event loop: HTTP, JSON, batching), the clients', other work and the hypervisor's steal.

Why twice the batch's clients: in a closed loop with one predictor, a batch's clients come
back while the next batch computes, so the clients split into two alternating batches. With
as many clients as a batch holds (32), batches settle at about 16 and the ceiling is the bare
predictor at batch 16 (0.85–0.9 of its best on a 2-core CPU): that measures the load, not the
host. With 64 clients each batch is full while the other's clients come back, and the
endpoint's best throughput is compared with the bare predictor's best, as the aim means.
(A longer max_wait_ms with 32 clients also fills batches, but the predictor then idles while
each batch's clients come back.) ``--clients 32`` measures the half-full case.

All of it twice: for the model as trained (FP32, Paddle Inference) and for its INT8 form
(ONNX Runtime, dynamic quantization, as a compression job makes it), whose predictor is two to
three times faster, so that the host's own cost per request weighs more. That cost is also
measured directly: the host process's CPU time per answered request.

Aims (issue #21): endpoint / bare ≥ 0.85 for FP32 and ≥ 0.75 for INT8 on a quiet machine,
endpoint / unbatched ≥ 1.5. Ends with one JSON line: bare_samples_per_s,
endpoint_samples_per_s, unbatched_samples_per_s, ratio_vs_bare, ratio_vs_unbatched, p50_ms,
p99_ms (the last two of the endpoint), host_cpu_us_per_request, and int8_bare_samples_per_s,
int8_endpoint_samples_per_s, int8_ratio_vs_bare, int8_host_cpu_us_per_request.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _harness import (
    PRESET,
    ROOT,
    Bare,
    Connection,
    Endpoint,
    Host,
    parse,
    print_result,
    quantile,
    requests_for,
    review_rows,
    runtime_env,
    runtime_python,
    shares,
    train_export,
)

from runtime.targets import ONNX, TARGETS_DIR  # after _harness: it puts the project on the path

# --smoke: one epoch on a few rows, windows of a fraction of a second, a few clients.
SMOKE = {
    "rows": 40,
    "epochs": 1,
    "texts": 32,
    "sizes": "1,4",
    "sweep_seconds": 0.2,
    "rounds": 1,
    "bare_seconds": 0.3,
    "seconds": 0.5,
    "warmup": 0.3,
    "unbatched_seconds": 0.5,
    "clients": 4,
    "max_batch_size": 4,
}


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Reviews of 20–60 characters whose label one keyword decides (learnable in a few
    epochs)."""
    return review_rows(n, seed, filler=(18, 58))


def load_test(
    port: int,
    prepared: list[bytes],
    clients: int,
    warmup_s: float,
    seconds: float,
    probe: Callable[[], dict[str, float]],
) -> dict:
    """``clients`` threads, each sending one request after another; the answers completed in
    the window [warm-up end, + seconds], their latencies in ms, and what ``probe`` counted."""
    start_at = time.perf_counter() + 0.2
    window = (start_at + warmup_s, start_at + warmup_s + seconds)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures: list[str] = []

    def client(i: int) -> None:
        try:
            conn = Connection(port)
        except OSError as exc:
            failures.append(f"connect: {exc}")
            return
        mine, n = latencies[i], i * 7
        try:
            time.sleep(max(0.0, start_at - time.perf_counter()))
            while (sent := time.perf_counter()) < window[1]:
                status, body = conn.call(prepared[n % len(prepared)])
                done = time.perf_counter()
                n += 1
                if status != 200:
                    failures.append(f"{status} {body[:300]!r}")
                    return
                if window[0] <= done < window[1]:
                    mine.append((done - sent) * 1000)
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    before = probe()
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    after = probe()
    for t in threads:
        t.join()
    if failures:
        sys.exit(f"{len(failures)} client(s) failed, the first: {failures[0]}")
    ms = [x for mine in latencies for x in mine]
    batches = after.pop("batches") - before.pop("batches")
    inputs = after.pop("batched_inputs") - before.pop("batched_inputs")
    return {
        "samples_per_s": len(ms) / seconds,
        "latencies_ms": ms,
        "mean_batch": inputs / max(1, batches),
        "shares": shares(before, after, seconds),
    }


def cpu_line(result: dict) -> str:
    """The CPU shares of a window, e.g. "CPU: predictor 97% (waited 2%), host 25%…"."""
    parts = []
    for name, share in result["shares"].items():
        if name.endswith(" waited"):
            parts[0] += f" (waited {share:.0%})"
        else:
            parts.append(f"{name} {share:.0%}")
    return "CPU: " + ", ".join(parts)


def describe(result: dict) -> str:
    ms = result["latencies_ms"]
    return (
        f"{result['samples_per_s']:.0f} samples/s, p50 {quantile(ms, 0.5):.1f} ms, p99 "
        f"{quantile(ms, 0.99):.1f} ms, mean batch {result['mean_batch']:.1f}; {cpu_line(result)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400, help="training rows")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--export", type=Path, help="an existing export: no training")
    parser.add_argument("--texts", type=int, default=512, help="distinct texts sent")
    parser.add_argument("--sizes", default="1,8,16,32,64", help="the bare batch sizes")
    parser.add_argument("--sweep-seconds", type=float, default=1.5, help="per bare batch size")
    parser.add_argument("--rounds", type=int, default=4, help="bare and endpoint windows")
    parser.add_argument("--bare-seconds", type=float, default=2.0, help="a bare window")
    parser.add_argument("--seconds", type=float, default=4.0, help="an endpoint window")
    parser.add_argument("--warmup", type=float, default=2.0, help="before a first window")
    parser.add_argument("--unbatched-seconds", type=float, default=8.0, help="its window")
    parser.add_argument("--clients", type=int, help="default: twice --max-batch-size")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    args = parse(parser, smoke=SMOKE)
    args.clients = args.clients or 2 * args.max_batch_size

    texts = [r["text"] for r in make_rows(args.texts, seed=1)]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp_name:
        tmp = Path(tmp_name)
        export = args.export
        if export is None:
            print(f"training {PRESET} on {args.rows} rows, {args.epochs} epochs", flush=True)
            started = time.perf_counter()
            export = train_export(tmp / "job", make_rows(args.rows), args.epochs)
            print(f"  trained and exported in {time.perf_counter() - started:.1f} s", flush=True)
        int8 = int8_export(export, tmp / "int8")
        texts_file = tmp / "texts.json"
        texts_file.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        print(
            f"{len(texts)} texts of {min(map(len, texts))}–{max(map(len, texts))} characters; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (other work on the "
            "CPU skews the figures)",
            flush=True,
        )
        host = Host(tmp / "host.log")
        try:
            print("FP32 (Paddle Inference, as trained):", flush=True)
            fp32 = measure(args, host, export, texts, texts_file, tmp, unbatched=True)
            print("INT8 (ONNX Runtime, dynamic quantization, runtime.compress):", flush=True)
            quantized = measure(args, host, int8, texts, texts_file, tmp, unbatched=False)
        finally:
            host.stop()

    ms = fp32["latencies_ms"]
    print_result(
        {
            "bare_samples_per_s": fp32["bare"],
            "endpoint_samples_per_s": fp32["endpoint"],
            "unbatched_samples_per_s": fp32["unbatched"],
            "ratio_vs_bare": fp32["ratio_vs_bare"],
            "ratio_vs_unbatched": round(fp32["endpoint"] / fp32["unbatched"], 3),
            "p50_ms": round(quantile(ms, 0.5), 2),
            "p99_ms": round(quantile(ms, 0.99), 2),
            "host_cpu_us_per_request": fp32["host_us"],
            "int8_bare_samples_per_s": quantized["bare"],
            "int8_endpoint_samples_per_s": quantized["endpoint"],
            "int8_ratio_vs_bare": quantized["ratio_vs_bare"],
            "int8_host_cpu_us_per_request": quantized["host_us"],
        }
    )


def int8_export(export: Path, out: Path) -> Path:
    """The export's INT8 form, as a compression job makes it (runtime.compress.quantize on its
    ONNX target, dynamic mode), in the runtime venv."""
    code = (
        "import sys; from pathlib import Path; from runtime.compress import quantize; "
        "quantize(Path(sys.argv[1]), Path(sys.argv[2]), 'dynamic', [])"
    )
    onnx = export.parent / TARGETS_DIR / ONNX
    subprocess.run(
        [runtime_python(), "-c", code, str(onnx), str(out)],
        cwd=ROOT,
        env=runtime_env(),
        check=True,
    )
    return out


def measure(args, host: Host, export: Path, texts, texts_file: Path, tmp: Path, unbatched: bool):
    """One export: the bare predictor and the endpoint in alternating rounds (and, if asked,
    the unbatched endpoint after them); its figures."""
    bare = Bare(export, texts_file, tmp / "bare.log")
    try:
        sweep = {
            size: bare.measure(size, args.sweep_seconds)["samples_per_s"]
            for size in (int(s) for s in args.sizes.split(","))
        }
        best = max(sweep, key=lambda s: sweep[s])
        print(
            "  bare predictor: "
            + ", ".join(f"batch {s}: {v:.0f}" for s, v in sweep.items())
            + f" samples/s; best batch {best}",
            flush=True,
        )
        batched = Endpoint(host, export, "batched", args.max_batch_size, args.max_wait_ms)
        batched.check(texts[0])
        prepared = requests_for(host, batched.api_key, texts)
        print(
            f"  endpoint: one replica, max_batch_size {args.max_batch_size}, max_wait_ms "
            f"{args.max_wait_ms:g}, {args.clients} clients (loaded in {batched.load_s} s)",
            flush=True,
        )
        bare_rates, rounds, same = [], [], []
        for i in range(args.rounds):
            window = bare.measure(best, args.bare_seconds)
            bare_rates.append(window["samples_per_s"])
            warmup = args.warmup if i == 0 else 1.0
            rounds.append(
                load_test(host.port, prepared, args.clients, warmup, args.seconds, batched.probe)
            )
            # The bare predictor at the batch size the endpoint ran: what the server itself
            # costs, apart from the batch sizes its load allowed.
            own = max(1, round(rounds[-1]["mean_batch"]))
            same.append(bare.measure(own, args.bare_seconds)["samples_per_s"])
            print(
                f"    round {i + 1}: ratio {rounds[-1]['samples_per_s'] / bare_rates[-1]:.3f}\n"
                f"      bare     {bare_rates[-1]:.0f} samples/s; {cpu_line(window)}\n"
                f"      endpoint {describe(rounds[-1])}\n"
                f"      bare at batch {own}: {same[-1]:.0f} samples/s; endpoint / that "
                f"{rounds[-1]['samples_per_s'] / same[-1]:.3f}",
                flush=True,
            )
        batched.remove()
        unbatched_rate = None
        if unbatched:
            plain = Endpoint(host, export, "unbatched", 1, 0)
            plain.check(texts[0])
            result = load_test(
                host.port,
                requests_for(host, plain.api_key, texts),
                args.clients,
                args.warmup,
                args.unbatched_seconds,
                plain.probe,
            )
            print(f"  unbatched (max_batch_size 1, max_wait_ms 0): {describe(result)}")
            plain.remove()
            unbatched_rate = round(result["samples_per_s"], 1)
    finally:
        bare.close()

    bare_rate = statistics.mean(bare_rates)
    endpoint_rate = statistics.mean(r["samples_per_s"] for r in rounds)
    # The host's own CPU per answered request (HTTP, JSON, batching): CPU time, not wall time,
    # so the least moved by other work on the machine.
    host_us = statistics.mean(
        r["shares"]["host"] * 1e6 / r["samples_per_s"] for r in rounds if r["samples_per_s"]
    )
    median_ratio = statistics.median(
        r["samples_per_s"] / b for r, b in zip(rounds, bare_rates, strict=True)
    )
    print(
        f"  endpoint / bare (batch {best}): {endpoint_rate / bare_rate:.3f} (the median of the "
        f"rounds' {median_ratio:.3f}); endpoint / bare at the endpoint's own mean batch: "
        f"{endpoint_rate / statistics.mean(same):.3f}; the host's CPU per request "
        f"{host_us:.0f} µs",
        flush=True,
    )
    return {
        "bare": round(bare_rate, 1),
        "endpoint": round(endpoint_rate, 1),
        "unbatched": unbatched_rate,
        "ratio_vs_bare": round(endpoint_rate / bare_rate, 3),
        "host_us": round(host_us, 1),
        "latencies_ms": [x for r in rounds for x in r["latencies_ms"]],
    }


if __name__ == "__main__":
    main()
