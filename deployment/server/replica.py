"""A predictor process: loads one exported model and answers batches sent over a pipe.

Paddle Inference predictors are not thread-safe, so each replica of a revision is a process of
its own with one predictor (one math thread: the replicas are the parallelism). Messages are
tuples: the parent sends a list of inputs (or ``None`` to stop); the child answers
``("ready", info)`` once after warm-up, then ``("ok", predictions)`` or ``("error", message)``
per batch. A failure to load is ``("failed", message)``, and the process ends.
"""

import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

# Spawned, not forked: the parent runs an event loop and threads that a fork would copy.
CONTEXT = multiprocessing.get_context("spawn")


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
        conn.send(("ready", {"load_s": round(time.perf_counter() - started, 3)}))
    except Exception as exc:
        traceback.print_exc()
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
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
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def main(conn: Connection, export_dir: str, device: str, max_batch_size: int) -> None:
    def load():
        from training.inference import Predictor

        predictor = Predictor.load(export_dir, device)
        text = "预热" * predictor.max_length
        item = (
            {"text_a": text, "text_b": text} if predictor.space.task_kind == "text_pair" else text
        )
        # Each batch size at the longest length, so the first real requests find the
        # predictor's buffers already sized.
        for size in warmup_sizes(max_batch_size):
            predictor.predict([item] * size, batch_size=size)
        return lambda items: conn.send(("ok", predictor.predict(items, batch_size=len(items))))

    serve(conn, load)


class Replica:
    """The parent's handle on one predictor process. ``call`` blocks: run it in a thread."""

    # What the process runs: main(conn, export_dir, device, max_batch_size).
    target = staticmethod(main)
    name = "predictor"

    def __init__(self, export_dir: str, device: str, max_batch_size: int) -> None:
        self.conn, child = CONTEXT.Pipe()
        self.process = CONTEXT.Process(
            target=self.target,
            args=(child, export_dir, device, max_batch_size),
            daemon=True,
            name=self.name,
        )
        self.process.start()
        child.close()
        self.lock = threading.Lock()

    def wait_ready(self) -> dict:
        """Block until warmed up; raise RuntimeError with the reason if loading failed."""
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"the predictor process exited while loading (exit code {self.process.exitcode})"
            ) from None
        if kind != "ready":
            raise RuntimeError(payload)
        return payload

    def call(self, items: list) -> list[dict]:
        with self.lock:
            try:
                self.conn.send(items)
                kind, payload = self.conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                raise RuntimeError(
                    f"the predictor process died (exit code {self.process.exitcode})"
                ) from None
        if kind != "ok":
            raise RuntimeError(payload)
        return payload

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
