"""What the benchmarks share (not a benchmark: `make bench` skips files starting with _): the
smoke size, the Django setup on a throwaway database, a dataset version by the real import
path, the train worker, the job runner, the serving host and its clients, the test data, the
JSON line each benchmark ends with.

The benchmarks import this module only: a sibling module named like a top-level package
(``serving``) would shadow it, since a script's own folder comes first on ``sys.path``.
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
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The project's packages before this folder: `serving` is the serving host, not serving.py.
sys.path.insert(0, str(ROOT))

from runtime.net import free_port  # noqa: E402 - after the path above

LABELS = ["正面", "负面"]
POS, NEG = ["很好", "满意", "喜欢", "推荐", "不错"], ["很差", "失望", "讨厌", "退货", "糟糕"]
CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说"
    "产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使"
)
PRESET = "ernie-micro-char"
SECRET_KEY = "benchmark-only-secret-key-0123456789"  # noqa: S105 - a throwaway platform


# -- Sizes and the result ----------------------------------------------------------------------


def parse(parser: argparse.ArgumentParser, smoke: dict) -> argparse.Namespace:
    """The arguments; with ``--smoke`` (or BENCH_SMOKE=1) the defaults are ``smoke``'s: a run of
    seconds that checks the benchmark still works end to end, not its figures. Arguments
    given still win."""
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds (also BENCH_SMOKE=1)"
    )
    if "--smoke" in sys.argv[1:] or os.environ.get("BENCH_SMOKE") == "1":
        os.environ["BENCH_SMOKE"] = "1"  # for the processes it starts again
        parser.set_defaults(**smoke)
    return parser.parse_args()


def print_result(figures: dict) -> None:
    """The benchmark's last line: one JSON object (its keys are named by the issues)."""
    print(json.dumps(figures), flush=True)


def review_rows(n: int, seed: int = 0, filler: tuple[int, int] = (18, 68)) -> list[dict]:
    """Reviews whose label one keyword decides (learnable in a few epochs), amid ``filler``
    random common characters."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        text = "".join(rng.choices(CHARS, k=rng.randint(*filler)))
        cut = rng.randint(0, len(text))
        word = rng.choice(POS if positive else NEG)
        rows.append({"text": text[:cut] + word + text[cut:], "label": LABELS[not positive]})
    return rows


# -- Django ------------------------------------------------------------------------------------


def bench_env(tmp: Path, database_url: str = "") -> dict[str, str]:
    """The settings of a throwaway platform in ``tmp``: its data directory and database, and a
    secret key and domain of Label Studio accounts of its own: its team 1's service account (and
    the token derived from the key) is not another platform's on the same Label Studio (the
    suite's, or another benchmark's, when `make test` runs them)."""
    own = hashlib.sha256(bytes(tmp)).hexdigest()[:8]
    return {
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "PLATFORM_DATA_DIR": str(tmp / "data"),
        "DATABASE_URL": database_url or f"sqlite:///{tmp}/bench.sqlite3",
        "SECRET_KEY": f"{SECRET_KEY}-{own}",
        "LABEL_STUDIO_ACCOUNT_DOMAIN": f"bench-{own}.test",
        "LOG_LEVEL": "WARNING",
    }


def setup_django(tmp: Path | None = None, database_url: str = "", **extra: str) -> None:
    """Django in this process, on the platform of ``tmp`` (none: the environment's, as a
    measuring child process the benchmark set up gets it), migrated."""
    if tmp is not None:
        os.environ.update({**bench_env(tmp, database_url), **extra})
        os.environ.pop("CELERY_TASK_ALWAYS_EAGER", None)  # jobs go through real workers
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def workspace(prefix: str) -> tempfile.TemporaryDirectory:
    """A throwaway directory the job runners reach: as root they run as PLATFORM_RUNNER_USER
    (runtime/sandbox.py), who must pass through it (0711, where mkdtemp makes it 0700)."""
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    os.chmod(tmp.name, 0o711)  # noqa: S103 - passing, not listing
    return tmp


def bench_team(username: str = "bench"):
    """A staff user and the team it owns."""
    from django.contrib.auth import get_user_model

    from console.services import team_create

    user = get_user_model().objects.create_user(username, is_staff=True)
    return user, team_create(actor=user, name="bench")


def import_version(actor, team, data: bytes, fmt: str, mapping: dict, labels=LABELS):
    """A text-classification dataset version of ``data`` by the real import path (upload,
    import job, splits 0.8/0.1/0.1), the import run in this process (eager Celery)."""
    from console.celery import app
    from labeling.datasets import dataset_create
    from tests.helpers.data import start_import, upload_data

    dataset = dataset_create(
        actor=actor, team=team, name="reviews", task_kind="text_classification", labels=labels
    )
    upload = upload_data(actor, team, data, fmt)
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        job = start_import(actor, dataset, upload, mapping, fmt)
    finally:
        app.conf.task_always_eager = eager
    job.refresh_from_db()
    if job.status != "succeeded":
        sys.exit(f"the import failed: {job.error}")
    return job.version


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def start_train_worker(node: str, log: Path, queue: str = "train.cpu") -> subprocess.Popen:
    """This machine's train worker as `make run` starts it (``manage.py train_worker``): it
    registers a node of one CPU slot, then consumes ``queue``; a job waits for a live node with
    a free device, so a bare Celery worker would leave it queued. Returns once it answers."""
    from console.celery import app

    env = {**os.environ, "PLATFORM_NODE_NAME": node, "PLATFORM_DEVICES": "cpu:1"}
    command = [sys.executable, "manage.py", "train_worker", "--loglevel", "WARNING"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
    name = f"train@{node}"
    deadline = time.monotonic() + 90
    while not any(name in reply for reply in app.control.ping(timeout=1)):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            sys.exit(f"the train worker did not come up; its log:\n{log.read_text()[-3000:]}")
    others = [
        worker
        for worker, queues in (app.control.inspect(timeout=1).active_queues() or {}).items()
        if worker != name and any(q["name"] == queue for q in queues)
    ]
    if others:
        stop(proc)
        sys.exit(f"other workers consume {queue} on this Redis: {', '.join(others)}")
    return proc


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Terminate a process the benchmark started; kill it if it does not end in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def under_redis(flag: str) -> None:
    """Run this script again under a throwaway Redis of its own (platform/embedded_redis.py),
    unless ``flag`` in the environment says this is that run."""
    if os.environ.get(flag):
        return
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env[flag] = "1"
    embedded = [sys.executable, str(ROOT / "platform" / "embedded_redis.py"), "run", "--"]
    sys.exit(subprocess.call([*embedded, sys.executable, sys.argv[0], *sys.argv[1:]], env=env))


# -- The job runner (runtime venv) -------------------------------------------------------------


def runtime_python() -> str:
    return os.environ.get("TRAINING_PYTHON") or str(ROOT / ".venv-runtime" / "bin" / "python")


def runtime_env(**extra: str) -> dict:
    """The environment of a process in the runtime venv: no Django, Paddle without torch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "USE_TORCH": "0", "USE_TF": "0", **extra}
    for var in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY"):
        env.pop(var, None)
    return env


def train_dev_test(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` cut 0.8 / 0.1 / 0.1 into the splits, in their order."""
    n = len(rows)
    return {
        "train": rows[: n * 8 // 10],
        "dev": rows[n * 8 // 10 : n * 9 // 10],
        "test": rows[n * 9 // 10 :],
    }


def write_splits(workdir: Path, splits: dict[str, list[dict]]) -> None:
    """The runner's data/<split>.jsonl files."""
    data = workdir / "data"
    data.mkdir(parents=True)
    for split, part in splits.items():
        (data / f"{split}.jsonl").write_bytes(jsonl(part))
    (data / ".complete").touch()


def run_job(workdir: Path, timeout: float = 900) -> Path:
    """The job runner (``python -m runtime.run``) on the spec and data in ``workdir``; its
    export directory."""
    run_events(workdir, timeout)
    return workdir / "export"


def run_events(workdir: Path, timeout: float = 900) -> list[dict]:
    """The job runner on ``workdir``, as ``run_job``; the events it reported."""
    proc = subprocess.run(
        [runtime_python(), "-m", "runtime.run", str(workdir)],
        cwd=ROOT,
        env=runtime_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"training failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    prefix = "@@event "  # runtime.run.EVENT_PREFIX (this venv need not import the runtime)
    return [
        json.loads(line[len(prefix) :])
        for line in proc.stdout.splitlines()
        if line.startswith(prefix)
    ]


def train_export(workdir: Path, rows: list[dict], epochs: int) -> Path:
    """PRESET trained for text classification on ``rows`` (0.8/0.1/0.1) by the job runner, as
    tests/deployment/fixtures.py trains one; the export directory."""
    from runtime.spec import Hyperparameters, JobSpec

    n = len(rows)
    cut, cut2 = n * 8 // 10, n * 9 // 10
    write_splits(workdir, {"train": rows[:cut], "dev": rows[cut:cut2], "test": rows[cut2:]})
    JobSpec(
        job_id=1,
        task_kind="text_classification",
        labels=LABELS,
        preset=PRESET,
        hyperparameters=Hyperparameters(
            epochs=epochs, batch_size=16, learning_rate=1e-3, max_seq_length=128, seed=0
        ),
    ).save(workdir)
    return run_job(workdir, timeout=600)


# -- The serving host and its clients ----------------------------------------------------------

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


def start_bare(script: str, args: list[str], log: Path, what: str) -> subprocess.Popen:
    """``script`` run by the runtime's Python with ``args``, on one thread as the host's
    predictor and generation processes, talking lines on stdin and stdout (stderr to ``log``);
    returns once it has said "ready"."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [runtime_python(), "-c", script, *args],
            cwd=ROOT,
            env=runtime_env(OMP_NUM_THREADS="1"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        sys.exit(f"the {what} did not load:\n{log.read_text()[-3000:]}")
    return proc


class Bare:
    """The bare predictor's process, measuring on demand."""

    def __init__(self, export: Path, texts_file: Path, log: Path) -> None:
        self.log = log
        self.proc = start_bare(BARE, [str(export), str(texts_file)], log, "bare predictor")

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
        stop(self.proc, timeout=10)


class Host:
    """A serving host process (``python -m serving``) on a free port, and its management API."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
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

    def load(
        self, key: str, export: Path, max_batch_size: int, max_wait_ms: float, **extra
    ) -> dict:
        config = {
            "export_dir": str(export),
            "replicas": 1,
            "max_batch_size": max_batch_size,
            "max_wait_ms": max_wait_ms,
            **extra,
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
        stop(self.proc, timeout=20)


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


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- CPU accounting (Linux; zeros elsewhere) ---------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, 0 where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_delay(pid: int) -> float:
    """Seconds the threads of a process were runnable but waited for a CPU."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def usage(processes: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, the machine's busy and stolen CPU seconds,
    and the first process's waits for a CPU."""
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
