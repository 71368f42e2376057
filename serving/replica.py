"""A predictor process: loads one exported model and answers batches sent over a pipe.

Paddle Inference predictors are not thread-safe, so each replica of a revision is a process of
its own with one predictor (one math thread: the replicas are the parallelism). Messages are
tuples: the parent sends a list of inputs (or ``None`` to stop); the child answers
``("ready", info)`` once after warm-up, then ``("ok", predictions)`` or ``("error", message)``
per batch. A failure to load is ``("failed", message)``, and the process ends.

The process is started (``python -m serving.replica``, not forked: the parent runs an
event loop and threads that a fork would copy) in the sandbox of ``runtime.sandbox``: an
environment without the serving host's secret nor any other of the platform's, and, where the
host runs as root, as ``PLATFORM_RUNNER_USER``, reading a copy of the model staged for it.
Its answers are JSON, never pickles: the host trusts nothing the process says.
"""

import ctypes
import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import orjson

from runtime import sandbox
from runtime.env import env_int, env_str

ROOT = Path(__file__).resolve().parent.parent.parent


def predictor_user(key: str | None = None) -> sandbox.RunnerUser:
    """Whom a revision's predictor and engine processes run as where the host is root: with
    ``key`` (the revision's), a uid of its own claimed for it (PLATFORM_RUNNER_UID_BASE; give
    it back with ``sandbox.release_user``), else PLATFORM_RUNNER_USER (shared)."""
    name = env_str("PLATFORM_RUNNER_USER")
    if key is None:
        return sandbox.runner_user(name)
    base = env_int("PLATFORM_RUNNER_UID_BASE", sandbox.DEFAULT_UID_BASE, min=0, empty=0)
    return sandbox.claim_user(name, base, key)


def predictor_env(home: Path | None = None) -> dict[str, str]:
    """A predictor's environment: the sandbox's allowlist, the code on PYTHONPATH."""
    return sandbox.sandbox_env(
        {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, home=home
    )


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a host killed outright leaves no predictor holding a device.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


# numpy's scalars as their numbers, as json.dumps wrote a numpy float64 (a float subclass).
SEND_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def send(conn: Connection, message: tuple) -> None:
    """An answer of the process to the host: JSON, so the host unpickles nothing of it."""
    conn.send_bytes(orjson.dumps(message, option=SEND_OPTIONS))


def receive(conn: Connection) -> tuple:
    kind, payload = orjson.loads(conn.recv_bytes())
    return kind, payload


def warmup_sizes(max_batch_size: int) -> list[int]:
    """The batch sizes warm-up runs: powers of two up to the maximum, and the maximum."""
    sizes, n = [], 1
    while n < max_batch_size:
        sizes.append(n)
        n *= 2
    return [*sizes, max_batch_size]


def serve(conn: Connection, load: Callable[[], Callable[[object], None]]) -> None:
    """A model process's life: ``load()`` loads the model, warms it up and returns the handler
    of one message (which sends its own answers); then ready (or failed, with the reason),
    and each message handled until ``None`` or the parent is gone. A message that fails is
    answered ``("error", message)``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        started = time.perf_counter()
        handle = load()
        send(conn, ("ready", {"load_s": round(time.perf_counter() - started, 3)}))
    except Exception as exc:
        traceback.print_exc()
        send(conn, ("failed", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return  # the serving host is gone
        if message is None:
            return
        try:
            handle(message)
        except Exception as exc:
            send(conn, ("error", f"{type(exc).__name__}: {exc}"))


def main(conn: Connection, export_dir: str, device: str, max_batch_size: int) -> None:
    def load():
        from runtime.inference import Predictor

        predictor = Predictor.load(export_dir, device)
        # One window's worth: a longer text is read in several windows (runtime.data.predict).
        text = ("预热" * predictor.max_length)[: predictor.max_length - 2]
        item = (
            {"text_a": text, "text_b": text} if predictor.space.task_kind == "text_pair" else text
        )
        # Each batch size at the longest length, so the first real requests find the
        # predictor's buffers already sized.
        for size in warmup_sizes(max_batch_size):
            predictor.predict([item] * size, batch_size=size)
        return lambda items: send(conn, ("ok", predictor.predict(items, batch_size=len(items))))

    serve(conn, load)


class Replica:
    """The parent's handle on one predictor process. ``call`` blocks: run it in a thread."""

    # What the process runs: <module>.main(conn, export_dir, device, max_batch_size).
    target = "serving.replica"
    name = "predictor"

    def __init__(
        self,
        export_dir: str,
        device: str,
        max_batch_size: int,
        user: sandbox.RunnerUser | None = None,
    ) -> None:
        self.conn, child = multiprocessing.Pipe()
        user = user or predictor_user()
        home = Path(export_dir).parent / "home" if user.switch else None
        if home is not None:
            # In the predictors' own directory: whatever an earlier one left there is not
            # followed.
            if home.is_symlink() or (home.exists() and not home.is_dir()):
                home.unlink()
            home.mkdir(exist_ok=True)
            os.chown(home, user.uid, user.gid, follow_symlinks=False)
        fd = child.fileno()
        args = [self.target, str(fd), export_dir, device, str(max_batch_size)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.replica", *args],
            pass_fds=[fd],
            cwd=home or ROOT,
            env=predictor_env(home),
            preexec_fn=_die_with_parent,
            **user.popen_kwargs(),
        )
        child.close()
        self.lock = threading.Lock()

    def wait_ready(self) -> dict:
        """Block until warmed up; raise RuntimeError with the reason if loading failed."""
        try:
            kind, payload = receive(self.conn)
        except (EOFError, ValueError):
            raise RuntimeError(
                f"the predictor process exited while loading (exit code {self.exitcode})"
            ) from None
        if kind != "ready":
            raise RuntimeError(payload)
        return payload

    def call(self, items: list) -> list[dict]:
        with self.lock:
            try:
                self.conn.send(items)
                kind, payload = receive(self.conn)
            except (EOFError, OSError, ValueError):
                # The pipe is lost: the process is gone or useless. Reap it (one just killed
                # may not have exited yet), so that the revision sees it dead and replaces it.
                try:
                    self.process.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
                raise RuntimeError(
                    f"the predictor process died (exit code {self.exitcode})"
                ) from None
        if kind != "ok":
            raise RuntimeError(payload)
        return payload

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()


if __name__ == "__main__":
    # python -m serving.replica <module> <fd> <export_dir> <device> <max_batch_size>
    module, fd, export_dir, device, max_batch_size = sys.argv[1:]
    importlib.import_module(module).main(
        Connection(int(fd)), export_dir, device, int(max_batch_size)
    )
