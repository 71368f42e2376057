"""Serving speed: one exported model served three ways in one run, on the same texts.

    .venv/bin/python benchmarks/serving.py   # [--seconds S] [--rounds N] [--max-wait-ms M]

(a) bare: ``runtime.inference.Predictor`` in a process of its own (the runtime venv, where
    Paddle is) predicting the texts at batch sizes 1…64, one batch after another; the best
    batch size's samples/s is the limit.
(b) endpoint: the serving host (``python -m serving``) with one revision of ONE
    replica, max_batch_size 32 and max_wait_ms 2, called over HTTP by 32 concurrent clients,
    each sending one text per request (``{"inputs": [text]}``) on a keep-alive connection and
    the next as soon as it is answered.
(c) unbatched: the same host and load, the revision loaded with max_batch_size 1 and
    max_wait_ms 0 (a batch of one per request, as a server without a batcher runs).

One replica is one predictor process with one math thread, and the bare predictor runs with
one thread too (``Predictor.load`` sets it on a CPU), so (a), (b) and (c) have the same
compute; what (b) adds is HTTP, JSON, the batcher and the pipe to the predictor process, and
they share the machine's other cores with the clients. The model is ``ernie-micro-char``
trained for text classification by the real job runner (``python -m runtime.run``, as
tests/deployment/conftest.py trains one) on reviews of 20–60 characters, max_seq_length 128
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

max_wait_ms 2: with as many clients as a batch holds (a closed loop), the answers of one batch
bring its clients' next requests back over the time the host takes to answer and parse them
(about 0.5 ms of the host's CPU a request here, so some 15 ms for 32). A short wait sends what
is queued when the predictor frees up: two batches of about 16 alternate, one computing while
the other's clients come back, and the predictor is busy all the time; the ceiling is the bare
predictor at batch 16, 0.85–0.9 of batch 32 on a 2-core CPU. A wait as long as that spread
(5 ms here) settles into batches of 32, but then the predictor idles a fifth of the time while
each batch's clients come back, which costs more. ``--clients 64`` keeps batches of 32 full
and the predictor busy: the endpoint then reaches about 0.95 of the bare predictor.

Aims: endpoint / bare ≥ 0.8, endpoint / unbatched ≥ 1.5. Ends with one JSON line:
bare_samples_per_s, endpoint_samples_per_s, unbatched_samples_per_s, ratio_vs_bare,
ratio_vs_unbatched, p50_ms, p99_ms (the last two of the endpoint).
"""

import argparse
import hashlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from _reviews import LABELS, review_rows

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PRESET = "ernie-micro-char"
ENDPOINT = "bench"

# The bare predictor, in the runtime venv: argv = export dir, a JSON file of texts. Prints
# "ready", then answers each line "<batch size> <seconds>" on stdin with a line of JSON: the
# samples/s of predicting the texts in batches of that size, one after another, for that long.
BARE = r"""
import json, sys, time
from runtime.inference import Predictor

predictor = Predictor.load(sys.argv[1])
texts = json.loads(open(sys.argv[2], encoding="utf-8").read())
print("ready", flush=True)
for line in sys.stdin:
    size, seconds = int(line.split()[0]), float(line.split()[1])
    predictor.predict(texts[: size * 2], batch_size=size)  # warm-up: buffers of this size
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        chunk = texts[(done % len(texts)) :][:size]
        predictor.predict(chunk, batch_size=size)
        done += len(chunk)
    print(json.dumps({"samples_per_s": done / elapsed}), flush=True)
"""


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Reviews of 20–60 characters whose label one keyword decides (learnable in a few
    epochs)."""
    return review_rows(n, seed, filler=(18, 58))


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
    from runtime.spec import Hyperparameters, JobSpec

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
        [runtime_python(), "-m", "runtime.run", str(workdir)],
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


class Bare:
    """The bare predictor's process, measuring on demand."""

    def __init__(self, export: Path, texts_file: Path, log: Path) -> None:
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [runtime_python(), "-c", BARE, str(export), str(texts_file)],
                cwd=ROOT,
                env=runtime_env(OMP_NUM_THREADS="1"),  # as the host's predictor processes
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        if self._line() != "ready":
            sys.exit(f"the bare predictor did not load:\n{log.read_text()[-3000:]}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            sys.exit(f"the bare predictor exited ({code}):\n{self.log.read_text()[-3000:]}")
        return line.strip()

    def measure(self, size: int, seconds: float) -> dict:
        """Samples/s at ``size``, and the shares of the window the bare process waited for a
        CPU and other processes ran (the call's warm-up included)."""
        assert self.proc.stdin is not None
        before, started = usage({"bare": self.proc.pid}), time.perf_counter()
        self.proc.stdin.write(f"{size} {seconds}\n")
        self.proc.stdin.flush()
        result = json.loads(self._line())
        elapsed = time.perf_counter() - started
        after = usage({"bare": self.proc.pid})
        return {**result, "shares": shares(before, after, elapsed)}

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
                [runtime_python(), "-m", "serving", "--port", str(self.port)],
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


def run_delay(pid: int) -> float:
    """Seconds the threads of a process were runnable but waited for a CPU (Linux)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def usage(processes: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, the machine's busy and stolen CPU seconds,
    and the first process's waits for a CPU (Linux; zeros elsewhere)."""
    out = {name: cpu_seconds(pid) for name, pid in processes.items()}
    try:
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except (OSError, ValueError):
        cpu = [0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = cpu
    tick = os.sysconf("SC_CLK_TCK")
    out["busy"] = (user + nice + system + irq + softirq) / tick
    out["stolen"] = steal / tick
    name, pid = next(iter(processes.items()))
    out[f"{name} waited"] = run_delay(pid)
    return out


def shares(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    """Each counter's growth as a share of ``seconds`` (of one CPU); "other work" is the
    machine's busy CPU less the named processes'."""
    out = {k: (after[k] - before[k]) / seconds for k in before}
    busy = out.pop("busy")
    named = sum(v for k, v in out.items() if k != "stolen" and not k.endswith(" waited"))
    out["other work"] = max(0.0, busy - named)
    return out


def predictor_pid(host: Host) -> int | None:
    """The host's predictor process (one revision loaded): a spawned child, not
    multiprocessing's resource tracker."""
    try:
        kids = Path(f"/proc/{host.proc.pid}/task/{host.proc.pid}/children").read_text().split()
    except OSError:
        return None
    for pid in kids:
        try:
            if b"serving.replica" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except OSError:
            pass
    return None


class Endpoint:
    """One revision loaded alone on the host and the endpoint routed to it."""

    def __init__(self, host: Host, export: Path, key: str, batch: int, wait_ms: float) -> None:
        self.host, self.key, self.api_key = host, key, secrets.token_urlsafe(16)
        self.load_s = host.load(key, export, batch, wait_ms)["load_s"]
        host.route(key, self.api_key)
        self.predictor = predictor_pid(host)

    def check(self, text: str) -> None:
        """One request the ordinary way: the endpoint answers a label of the model."""
        request = urllib.request.Request(  # noqa: S310 - our own loopback host
            f"{self.host.url}/v1/endpoints/{ENDPOINT}:predict",
            data=json.dumps({"inputs": [text]}).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
            answer = json.loads(r.read())
        assert answer["outputs"][0]["label"] in LABELS, answer

    def probe(self) -> dict[str, float]:
        """Counters whose growth over a window the load test reports."""
        rev = self.host.manage("GET", "/manage/state")["revisions"][self.key]
        processes = {"host": self.host.proc.pid, "clients": os.getpid()}
        if self.predictor:
            processes = {"predictor": self.predictor, **processes}
        out = usage(processes)
        return {**out, "batches": rev["batches"], "batched_inputs": rev["batched_inputs"]}

    def remove(self) -> None:
        self.host.manage("DELETE", f"/manage/endpoints/{ENDPOINT}")
        self.host.manage("DELETE", f"/manage/revisions/{self.key}")


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


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
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
        texts_file = tmp / "texts.json"
        texts_file.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        print(
            f"{len(texts)} texts of {min(map(len, texts))}–{max(map(len, texts))} characters; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (other work on the "
            "CPU skews the figures)",
            flush=True,
        )
        bare = Bare(export, texts_file, tmp / "bare.log")
        host: Host | None = None
        try:
            sweep = {
                size: bare.measure(size, args.sweep_seconds)["samples_per_s"]
                for size in (int(s) for s in args.sizes.split(","))
            }
            best = max(sweep, key=lambda s: sweep[s])
            print(
                "bare predictor: "
                + ", ".join(f"batch {s}: {v:.0f}" for s, v in sweep.items())
                + f" samples/s; best batch {best}",
                flush=True,
            )
            host = Host(tmp / "host.log")
            batched = Endpoint(host, export, "batched", args.max_batch_size, args.max_wait_ms)
            batched.check(texts[0])
            prepared = requests_for(host, batched.api_key, texts)
            print(
                f"endpoint: one replica, max_batch_size {args.max_batch_size}, max_wait_ms "
                f"{args.max_wait_ms:g}, {args.clients} clients (loaded in {batched.load_s} s)",
                flush=True,
            )
            bare_rates, rounds, same = [], [], []
            for i in range(args.rounds):
                window = bare.measure(best, args.bare_seconds)
                bare_rates.append(window["samples_per_s"])
                warmup = args.warmup if i == 0 else 1.0
                rounds.append(
                    load_test(
                        host.port, prepared, args.clients, warmup, args.seconds, batched.probe
                    )
                )
                # The bare predictor at the batch size the endpoint ran: what the server itself
                # costs, apart from the batch sizes its load allowed.
                own = max(1, round(rounds[-1]["mean_batch"]))
                same.append((own, bare.measure(own, args.bare_seconds)["samples_per_s"]))
                print(
                    f"  round {i + 1}: ratio {rounds[-1]['samples_per_s'] / bare_rates[-1]:.3f}\n"
                    f"    bare     {bare_rates[-1]:.0f} samples/s; {cpu_line(window)}\n"
                    f"    endpoint {describe(rounds[-1])}\n"
                    f"    bare at batch {own}: {same[-1][1]:.0f} samples/s; endpoint / that "
                    f"{rounds[-1]['samples_per_s'] / same[-1][1]:.3f}",
                    flush=True,
                )
            batched.remove()
            plain = Endpoint(host, export, "unbatched", 1, 0)
            plain.check(texts[0])
            unbatched = load_test(
                host.port,
                requests_for(host, plain.api_key, texts),
                args.clients,
                args.warmup,
                args.unbatched_seconds,
                plain.probe,
            )
            print(f"unbatched (max_batch_size 1, max_wait_ms 0): {describe(unbatched)}")
            plain.remove()
        finally:
            bare.close()
            if host is not None:
                host.stop()

    bare_rate = statistics.mean(bare_rates)
    endpoint_rate = statistics.mean(r["samples_per_s"] for r in rounds)
    unbatched_rate = unbatched["samples_per_s"]
    ms = [x for r in rounds for x in r["latencies_ms"]]
    ratio_bare, ratio_unbatched = endpoint_rate / bare_rate, endpoint_rate / unbatched_rate
    median_ratio = statistics.median(
        r["samples_per_s"] / b for r, b in zip(rounds, bare_rates, strict=True)
    )
    same_ratio = endpoint_rate / statistics.mean(rate for _size, rate in same)
    print(
        f"endpoint / bare (batch {best}): {ratio_bare:.3f} (aim ≥ 0.8; the median of the "
        f"rounds' {median_ratio:.3f}); endpoint / unbatched: {ratio_unbatched:.2f} (aim ≥ 1.5); "
        f"endpoint / bare at the endpoint's own mean batch: {same_ratio:.3f}"
    )
    print(
        json.dumps(
            {
                "bare_samples_per_s": round(bare_rate, 1),
                "endpoint_samples_per_s": round(endpoint_rate, 1),
                "unbatched_samples_per_s": round(unbatched_rate, 1),
                "ratio_vs_bare": round(ratio_bare, 3),
                "ratio_vs_unbatched": round(ratio_unbatched, 3),
                "p50_ms": round(quantile(ms, 0.5), 2),
                "p99_ms": round(quantile(ms, 0.99), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
