"""A generative revision on the serving host: causal-LM processes that generate for batches of
requests and stream each request's text as it grows.

Requests wait in one queue. When a process is free, its loop takes the oldest request and
more until ``max_batch_size`` are in hand or ``max_wait_ms`` has passed since the oldest
arrived, and generates for them together (``runtime.generation``: static batching, each
request ending on its own stop). Each step's deltas come back over the pipe and go to the
requests' own queues, which the HTTP handlers stream from. Requests that arrive meanwhile wait
for the next batch.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

from runtime.chat import ChatTokenizer
from runtime.generation import Delta, GenerationRequest
from serving.replica import Replica, receive, send, serve
from serving.revision import PredictError, Revision


def main(conn: Connection, export_dir: str, device: str, max_batch_size: int) -> None:
    """The generation process: load, warm up with a full batch, then generate per message."""

    def load():
        from runtime.generation import Generator

        generator = Generator(Path(export_dir), device)
        prompt = generator.chat_prompt([{"role": "user", "content": "预热"}])
        generator.generate(
            [GenerationRequest(prompt, max_tokens=4, temperature=0)] * max_batch_size
        )

        def handle(batch: list[dict]) -> None:
            generator.generate(
                [GenerationRequest(**r) for r in batch],
                lambda deltas: send(conn, ("step", [asdict(d) for d in deltas])),
            )
            send(conn, ("done", None))

        return handle

    serve(conn, load)


class GenerationReplica(Replica):
    target = "serving.generative"
    name = "generator"

    def generate(self, requests: list[dict], on_step) -> None:
        """Send one batch and pass each step's deltas to ``on_step`` until it is done."""
        with self.lock:
            try:
                self.conn.send(requests)
                while True:
                    kind, payload = receive(self.conn)
                    if kind == "step":
                        on_step([Delta(**d) for d in payload])
                    elif kind == "done":
                        return
                    else:
                        raise RuntimeError(payload)
            except (EOFError, OSError, ValueError):
                raise RuntimeError(
                    f"the generation process died (exit code {self.exitcode})"
                ) from None


class Waiting:
    """A request in the revision's queue, and the queue its deltas go to."""

    def __init__(self, request: GenerationRequest, arrived: float) -> None:
        self.request = request
        self.arrived = arrived
        self.deltas: asyncio.Queue = asyncio.Queue()

    def wanted(self) -> bool:
        return True


class GenerativeRevision(Revision):
    """Generation instead of prediction; loading, readiness, restarts and unloading are the
    predictive revision's."""

    replica_class = GenerationReplica

    def __init__(self, key: str, config: dict) -> None:
        super().__init__(key, config)
        self.tokenizer: ChatTokenizer | None = None
        self.context_length = 0
        self.next_id = 0

    async def load(self) -> None:
        await super().load()
        if self.state == "ready":
            import json

            export_dir = Path(self.config["export_dir"])
            self.tokenizer = ChatTokenizer(export_dir)
            config = json.loads((export_dir / "config.json").read_text("utf-8"))
            self.context_length = int(config.get("max_position_embeddings") or 2048)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """The request's deltas as its batch generates them; the last has ``finish_reason``."""
        self.next_id += 1
        request.id = self.next_id
        waiting = Waiting(request, time.monotonic())
        self.queue.put_nowait(waiting)
        while True:
            item = await waiting.deltas.get()
            if isinstance(item, Exception):
                raise item
            yield item
            if item.finish_reason is not None:
                return

    # Its queue holds only Waiting (stream() fills it) and its replicas are GenerationReplica.
    async def _run(self, replica: GenerationReplica, batch: list[Waiting]) -> None:  # type: ignore[override]
        """One batch generated together: each step's deltas go to their requests' queues."""
        loop = asyncio.get_running_loop()
        by_id = {w.request.id: w for w in batch}

        def on_step(deltas: list[Delta]) -> None:
            for d in deltas:
                loop.call_soon_threadsafe(by_id[d.id].deltas.put_nowait, d)

        requests = [asdict(w.request) for w in batch]
        await loop.run_in_executor(self.pool, replica.generate, requests, on_step)

    def _fail(self, batch: list[Waiting], error: PredictError) -> None:  # type: ignore[override]
        # After the deltas already scheduled from the generation thread.
        loop = asyncio.get_running_loop()
        for w in batch:
            loop.call_soon(w.deltas.put_nowait, error)

    async def unload(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait().deltas.put_nowait(PredictError("the revision was unloaded"))
        await super().unload()
