"""Serving speed: one exported model served three ways in one run, on the same texts.

    .venv/bin/python benchmarks/serving.py   # [--seconds S] [--clients N] [--max-wait-ms M]

(a) bare: ``training.inference.Predictor`` in a process of its own (the runtime venv, where
    Paddle is), predicting the texts at batch sizes 1…64; the best batch size is the limit.
(b) endpoint: the serving host (``python -m deployment.server``) with one revision of one
    replica, max_batch_size 32 and max_wait_ms 2, called over HTTP by 32 concurrent clients,
    each sending one text per request on a keep-alive connection and the next when answered.
(c) unbatched: the same host and load, the revision loaded with max_batch_size 1 and
    max_wait_ms 0 (a batch of one per request, as a server without a batcher would run).

One replica is one predictor process with one math thread, and the bare predictor also runs
with one thread (``Predictor.load`` sets it for the CPU), so (a), (b) and (c) have the same
compute; the endpoint's HTTP, JSON, batching and pipe to the predictor process are what (b)
adds. The model is ``ernie-micro-char`` trained for text classification by the real job runner
(``python -m training.run``, as tests/deployment/conftest.py trains one) on reviews of 20–60
characters, max_seq_length 128 (batches are padded to their longest text, so about 60).

max_wait_ms 2: with as many clients as a batch holds, each batch's answers send its clients'
next requests at once; a short wait lets a batch fill with those that arrive together, and a
batch cut short goes on computing while the rest arrive for the next (the batches pipeline). A
longer wait only leaves the predictor idle. The clients and the host share this machine's CPU,
so the clients are raw sockets with prepared request bytes (cheap per request).

Samples/s count the answers completed in the measured window (after a warm-up); latency is
from sending a request to reading its whole answer. Aims: endpoint / bare ≥ 0.8, endpoint /
unbatched ≥ 1.5.

Ends with one JSON line: bare_samples_per_s, endpoint_samples_per_s, unbatched_samples_per_s,
ratio_vs_bare, ratio_vs_unbatched, p50_ms, p99_ms (the last two of the endpoint).
"""

import argparse
import hashlib
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PRESET = "ernie-micro-char"
LABELS = ["正面", "负面"]
POS, NEG = ["很好", "满意", "喜欢", "推荐", "不错"], ["很差", "失望", "讨厌", "退货", "糟糕"]
CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说"
    "产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使"
)
ENDPOINT = "bench"

# The bare predictor, in the runtime venv: argv = export dir, seconds per batch size, sizes;
# the texts on stdin. One line of JSON: {batch size: samples/s}.
BARE = r"""
import json, sys, time
from training.inference import Predictor

predictor = Predictor.load(sys.argv[1])
seconds = float(sys.argv[2])
texts = json.loads(sys.stdin.read())
out = {}
for size in [int(s) for s in sys.argv[3].split(",")]:
    predictor.predict(texts[: size * 4], batch_size=size)  # warm-up: buffers of this size
    done, started = 0, time.perf_counter()
    while True:
        for start in range(0, len(texts), size):
            predictor.predict(texts[start : start + size], batch_size=size)
            done += len(texts[start : start + size])
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                break
        if elapsed >= seconds:
            break
    out[size] = done / elapsed
print(json.dumps(out))
"""


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Reviews of 20–60 characters whose label one keyword decides (learnable in a few
    epochs)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        filler = "".join(rng.choices(CHARS, k=rng.randint(18, 58)))
        cut = rng.randint(0, len(filler))
        word = rng.choice(POS if positive else NEG)
        rows.append({"text": filler[:cut] + word + filler[cut:], "label": LABELS[not positive]})
    return rows


def runtime_python() -> str:
    return os.environ.get("TRAINING_PYTHON") or str(ROOT / ".venv-runtime" / "bin" / "python")


def runtime_env(**extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "USE_TORCH": "0", "USE_TF": "0", **extra}
    for var in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY"):
        env.pop(var, None)
    return env


def train_export(workdir: Path, rows: list[dict], epochs: int) -> Path:
    """Train the preset on ``rows`` with the job runner, as tests/deployment/conftest.py's
    train_export does; the export directory."""
    from training.spec import Hyperparameters, JobSpec

    data = workdir / "data"
    data.mkdir(parents=True)
    n = len(rows)
    splits = {"train": rows[: n * 8 // 10], "dev": rows[n * 8 // 10 : n * 9 // 10]}
    splits["test"] = rows[n * 9 // 10 :]
    for split, part in splits.items():
        with open(data / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
    (data / ".complete").touch()
    JobSpec(
        job_id=1,
        task_kind="text_classification",
        labels=LABELS,
        preset=PRESET,
        hyperparameters=Hyperparameters(
            epochs=epochs, batch_size=16, learning_rate=1e-3, max_seq_length=128, seed=0
        ),
    ).save(workdir)
    proc = subprocess.run(
        [runtime_python(), "-m", "training.run", str(workdir)],
        cwd=ROOT,
        env=runtime_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"training failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return workdir / "export"


def run_bare(export: Path, texts: list[str], seconds: float, sizes: list[int]) -> dict[int, float]:
    proc = subprocess.run(
        [runtime_python(), "-c", BARE, str(export), str(seconds), ",".join(map(str, sizes))],
        input=json.dumps(texts, ensure_ascii=False),
        cwd=ROOT,
        env=runtime_env(OMP_NUM_THREADS="1"),  # as the serving host's predictor processes
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"the bare predictor failed:\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


class Host:
    """A serving host process on a free port, and its management API."""

    def __init__(self, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secrets.token_urlsafe(24)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [runtime_python(), "-m", "deployment.server", "--port", str(self.port)],
                cwd=ROOT,
                env=runtime_env(SERVING_SECRET=self.secret),
                stdout=out,
                stderr=out,
            )
        self.log = log
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:  # noqa: S310
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"the serving host did not start; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def manage(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(  # noqa: S310 - our own loopback host
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.secret}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
                raw = r.read()
        except urllib.error.HTTPError as exc:
            sys.exit(f"{method} {path}: {exc.code} {exc.read()[:500]!r}")
        return json.loads(raw) if raw else {}

    def load(self, key: str, export: Path, max_batch_size: int, max_wait_ms: float) -> dict:
        config = {
            "export_dir": str(export),
            "replicas": 1,
            "max_batch_size": max_batch_size,
            "max_wait_ms": max_wait_ms,
        }
        self.manage("PUT", f"/manage/revisions/{key}", config)
        deadline = time.monotonic() + 120
        while True:
            rev = self.manage("GET", "/manage/state")["revisions"].get(key) or {}
            if rev.get("state") == "ready":
                return rev
            if rev.get("state") == "failed" or time.monotonic() > deadline:
                sys.exit(f"revision {key} did not load: {rev}\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def route(self, key: str, api_key: str) -> None:
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        body = {
            "revisions": {key: 100},
            "keys": {digest: {"id": 1, "rate_per_s": None}},
            "max_inputs": 64,
        }
        self.manage("PUT", f"/manage/endpoints/{ENDPOINT}", body)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def requests_for(host: Host, api_key: str, texts: list[str]) -> list[bytes]:
    """One prepared HTTP/1.1 request per text: ``{"inputs": [text]}``."""
    out = []
    for text in texts:
        body = json.dumps({"inputs": [text]}, ensure_ascii=False).encode()
        head = (
            f"POST /v1/endpoints/{ENDPOINT}:predict HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{host.port}\r\n"
            f"Authorization: Bearer {api_key}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


class Connection:
    """A keep-alive connection that sends prepared requests and reads whole answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._read()
        head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4 :]
        status = int(head.split(" ", 2)[1])
        length = None
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length is None:
            raise RuntimeError(f"an answer without Content-Length: {head!r}")
        while len(self.buf) < length:
            self._read()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("the serving host closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux), 0 where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def load_test(
    port: int,
    prepared: list[bytes],
    clients: int,
    warmup_s: float,
    seconds: float,
    watch: dict[str, int] | None = None,
) -> dict:
    """``clients`` threads, each calling in a loop; the answers completed in the window
    [warm-up end, + seconds] and their latencies."""
    start_at = time.perf_counter() + 0.5
    window = (start_at + warmup_s, start_at + warmup_s + seconds)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures: list[str] = []

    def client(i: int) -> None:
        conn = Connection(port)
        mine = latencies[i]
        n = i * 7
        try:
            time.sleep(max(0.0, start_at - time.perf_counter()))
            while True:
                sent = time.perf_counter()
                if sent >= window[1]:
                    return
                status, body = conn.call(prepared[n % len(prepared)])
                done = time.perf_counter()
                n += 1
                if status != 200:
                    failures.append(f"{status} {body[:300]!r}")
                    return
                if window[0] <= done < window[1]:
                    mine.append(done - sent)
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    watch = {**(watch or {}), "clients": os.getpid()}
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    cpu_before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    cpu = {name: (cpu_seconds(pid) - cpu_before[name]) / seconds for name, pid in watch.items()}
    for t in threads:
        t.join()
    if failures:
        sys.exit(f"{len(failures)} client(s) failed, the first: {failures[0]}")
    all_ms = sorted(x * 1000 for mine in latencies for x in mine)
    return {
        "samples_per_s": len(all_ms) / seconds,
        "p50_ms": quantile(all_ms, 0.5),
        "p99_ms": quantile(all_ms, 0.99),
        "requests": len(all_ms),
        "cpu": cpu,
    }


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def check_answer(host: Host, api_key: str, text: str) -> None:
    """One request the ordinary way: the endpoint answers a label of the model."""
    request = urllib.request.Request(  # noqa: S310 - our own loopback host
        f"{host.url}/v1/endpoints/{ENDPOINT}:predict",
        data=json.dumps({"inputs": [text]}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
        answer = json.loads(r.read())
    assert answer["outputs"][0]["label"] in LABELS, answer


def serve(
    host: Host, export: Path, key: str, batch: int, wait_ms: float, texts: list[str], args
) -> dict:
    """Load ``key`` alone on the host, route the endpoint to it, put the load on it."""
    api_key = secrets.token_urlsafe(16)
    rev = host.load(key, export, batch, wait_ms)
    host.route(key, api_key)
    check_answer(host, api_key, texts[0])
    prepared = requests_for(host, api_key, texts)
    watch = {"host": host.proc.pid}
    for pid in children(host.proc.pid):  # the predictor process, not multiprocessing's tracker
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                watch["predictor"] = pid
        except OSError:
            pass
    result = load_test(host.port, prepared, args.clients, args.warmup, args.seconds, watch)
    after = host.manage("GET", "/manage/state")["revisions"][key]
    result["mean_batch"] = after["batched_inputs"] / max(1, after["batches"])
    result["load_s"] = rev["load_s"]
    host.manage("DELETE", f"/manage/endpoints/{ENDPOINT}")
    host.manage("DELETE", f"/manage/revisions/{key}")
    return result


def cpu_line(result: dict) -> str:
    return "CPU " + ", ".join(f"{name} {share:.0%}" for name, share in result["cpu"].items())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400, help="training rows")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--texts", type=int, default=512, help="distinct texts sent")
    parser.add_argument("--bare-seconds", type=float, default=3.0, help="per batch size")
    parser.add_argument("--bare-sizes", default="1,8,16,32,64")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured, per endpoint")
    parser.add_argument("--export", type=Path, help="an existing export: no training")
    args = parser.parse_args()

    texts = [r["text"] for r in make_rows(args.texts, seed=1)]
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp_name:
        tmp = Path(tmp_name)
        export = args.export
        if export is None:
            print(f"training {PRESET} on {args.rows} rows, {args.epochs} epochs", flush=True)
            started = time.perf_counter()
            export = train_export(tmp / "job", make_rows(args.rows), args.epochs)
            print(f"  trained and exported in {time.perf_counter() - started:.1f} s", flush=True)
        print(
            f"{len(texts)} texts of {min(map(len, texts))}–{max(map(len, texts))} characters; "
            f"load average {os.getloadavg()[0]:.2f} (other work on the CPU skews the figures)",
            flush=True,
        )
        sizes = [int(s) for s in args.bare_sizes.split(",")]
        bare = run_bare(export, texts, args.bare_seconds, sizes)
        best = max(bare, key=lambda s: bare[s])
        print(
            "bare predictor: "
            + ", ".join(f"batch {s}: {v:.0f}" for s, v in bare.items())
            + f" samples/s; best batch {best}",
            flush=True,
        )

        host = Host(tmp / "host.log")
        try:
            batched = serve(
                host, export, "batched", args.max_batch_size, args.max_wait_ms, texts, args
            )
            print(
                f"endpoint (max_batch_size {args.max_batch_size}, max_wait_ms "
                f"{args.max_wait_ms:g}): {batched['samples_per_s']:.0f} samples/s, p50 "
                f"{batched['p50_ms']:.1f} ms, p99 {batched['p99_ms']:.1f} ms, mean batch "
                f"{batched['mean_batch']:.1f}; {cpu_line(batched)}",
                flush=True,
            )
            unbatched = serve(host, export, "unbatched", 1, 0, texts, args)
            print(
                f"unbatched (max_batch_size 1, max_wait_ms 0): "
                f"{unbatched['samples_per_s']:.0f} samples/s, p50 {unbatched['p50_ms']:.1f} "
                f"ms, p99 {unbatched['p99_ms']:.1f} ms; {cpu_line(unbatched)}",
                flush=True,
            )
        finally:
            host.stop()

    bare_rate = bare[best]
    ratio_bare = batched["samples_per_s"] / bare_rate
    ratio_unbatched = batched["samples_per_s"] / unbatched["samples_per_s"]
    print(
        f"ratio vs bare: {ratio_bare:.3f} (aim ≥ 0.8); vs unbatched: {ratio_unbatched:.2f} "
        f"(aim ≥ 1.5); {args.clients} clients, one replica"
    )
    print(
        json.dumps(
            {
                "bare_samples_per_s": round(bare_rate, 1),
                "endpoint_samples_per_s": round(batched["samples_per_s"], 1),
                "unbatched_samples_per_s": round(unbatched["samples_per_s"], 1),
                "ratio_vs_bare": round(ratio_bare, 3),
                "ratio_vs_unbatched": round(ratio_unbatched, 3),
                "p50_ms": round(batched["p50_ms"], 2),
                "p99_ms": round(batched["p99_ms"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
