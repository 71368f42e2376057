"""A generative revision on the serving host: causal-LM processes that generate for the
requests they hold and stream each request's text as it grows.

Continuous batching: each process runs one ``runtime.generation.Batch``. Requests wait in the
revision's queue; a process's admission loop sends it the oldest ones whenever it holds fewer
than ``max_batch_size``, and they join its running batch at the next decoding step (their
prompts prefilled, their key/value caches appended), each leaving it as soon as it is done, so
a short request never waits for a long one. Each step's deltas come back over the pipe, read by
a thread per process, and go to the requests' own queues, which the HTTP handlers stream from.
A client that goes away cancels its request: it leaves the batch at the next step. At most
``max_queue`` requests wait (by default 4 per request the batches hold); beyond, the API
answers 429 with a Retry-After from the recent requests' durations.

Many LoRA adapters over the revision's model (``runtime.adapters``): ``"adapters": {name:
{"export_dir", "manifest_sha256"}}`` in its config (LoRA versions of the same base model). The
host checks each adapter's files against its manifest, stages them for the processes, and each
process loads it beside the model it serves; a request names one (``GenerationRequest.adapter``).
A change of the adapters alone is applied in place: the model is not loaded again, and a
removed adapter leaves each process once no request of its batch runs with it.

``"batching": "static"`` in a revision's config runs the engine as it was before, kept as the
benchmark's baseline (``benchmarks/generation.py``): requests are admitted only when the
process's batch is empty (up to ``max_batch_size``, waiting ``max_wait_ms`` for them), and rows
that are done stay in the batch until all are.
"""

import asyncio
import contextlib
import math
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

from runtime.adapters import NAME, AdapterError
from runtime.chat import ChatTokenizer
from runtime.generation import Delta, GenerationRequest
from runtime.inference import MANIFEST, read_manifest, sha256_file
from serving.replica import Replica, receive, send, serve
from serving.revision import PredictError, Revision, stage_export


def main(conn: Connection, export_dir: str, device: str, max_batch_size: int) -> None:
    """The generation process: load, warm up with a full batch, then run the batch: what the
    host sends joins it (``{"join": [requests], "static": …}``) or leaves it (``{"cancel":
    [ids]}``) at the next step, and each step's deltas go back, until it is empty and the
    process waits again. ``{"adapters": {"load": {name: directory}, "unload": [names]}}``
    loads adapters (answered ``("adapters", {name: {"bytes"} or {"error"}})``) and unloads
    others once no request of the batch runs with them."""

    def load():
        from runtime.generation import Generator

        generator = Generator(Path(export_dir), device)
        prompt = generator.chat_prompt([{"role": "user", "content": "预热"}])
        generator.generate(
            [GenerationRequest(prompt, max_tokens=4, temperature=0)] * max_batch_size
        )
        batch = generator.batch()
        joining: list[GenerationRequest] = []  # sent since the last step
        leaving: set[str] = set()  # adapters to unload once no request runs with them

        def unload_unused() -> None:
            for name in leaving - {s.request.adapter for s in batch.streams if s.finish is None}:
                generator.unload_adapter(name)
                leaving.discard(name)

        def adapters(message: dict) -> None:
            answers: dict[str, dict[str, object]] = {}
            for name, directory in message.get("load", {}).items():
                leaving.discard(name)
                try:
                    answers[name] = {"bytes": generator.load_adapter(name, Path(directory))}
                except Exception as exc:  # the host shows it; the others go on
                    answers[name] = {"error": f"{type(exc).__name__}: {exc}"}
            leaving.update(message.get("unload", []))
            unload_unused()
            send(conn, ("adapters", answers))

        def take(message) -> None:
            nonlocal batch
            if message is None:
                sys.exit(0)  # the host stops the process
            if "cancel" in message:
                cancelled = set(message["cancel"])
                batch.cancel(cancelled)
                joining[:] = [r for r in joining if r.id not in cancelled]
                return
            if "adapters" in message:
                adapters(message["adapters"])
                return
            if not len(batch) and not joining and batch.static != message["static"]:
                batch = generator.batch(message["static"])
            joining.extend(GenerationRequest(**r) for r in message["join"])

        def admit() -> None:
            """The requests that came since the last step join it, prefilled together."""
            # An adapter unloaded before its request arrived: that request fails, alone.
            known = set(generator.adapters.names()) if generator.adapters else set()
            lost = [r.id for r in joining if r.adapter and r.adapter not in known]
            if lost:
                send(conn, ("rejected", {"ids": lost, "error": "its adapter was unloaded"}))
            batch.add([r for r in joining if r.id not in lost])
            joining.clear()

        def handle(message) -> None:
            nonlocal batch
            try:
                take(message)
                while len(batch) or joining:
                    while conn.poll():
                        take(conn.recv())
                    if joining:
                        admit()
                    if not len(batch):
                        continue
                    deltas = batch.step()
                    if deltas:
                        send(conn, ("step", [asdict(d) for d in deltas]))
                    if leaving:
                        unload_unused()
            except Exception:
                batch = generator.batch()  # its requests are failed by the host
                joining.clear()
                raise

        return handle

    serve(conn, load)


class GenerationReplica(Replica):
    target = "serving.generative"
    name = "generator"

    def submit(self, message: dict) -> None:
        """``{"join": [requests], "static": bool}``, ``{"cancel": [ids]}`` or ``{"adapters":
        …}``; RuntimeError if the process is gone."""
        with self.lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):
                raise RuntimeError(
                    f"the generation process died (exit code {self.exitcode})"
                ) from None

    def read(self) -> tuple[str, object]:
        """The process's next message (blocks): ("step", deltas), ("adapters", answers),
        ("error", why), or ("died", why) when the pipe is gone."""
        try:
            return receive(self.conn)
        except (EOFError, OSError, ValueError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)  # reaped, so that it reads as dead
            return "died", f"the generation process died (exit code {self.exitcode})"


QUEUE_PER_SLOT = 4  # the queue's default bound, per request a batch holds
SYSTEM_PROMPTS = 64  # system prompts whose tokens a revision remembers
SYSTEM_PROMPT_CHARS = 16_384  # and the longest it remembers


class Waiting:
    """A request in the revision's queue, and the queue its deltas go to."""

    def __init__(self, request: GenerationRequest, arrived: float) -> None:
        self.request = request
        self.arrived = arrived
        self.deltas: asyncio.Queue = asyncio.Queue()
        self.gone = False  # its client went away

    def wanted(self) -> bool:
        return not self.gone


class GenerativeRevision(Revision):
    """Generation instead of prediction; loading, readiness and unloading are the predictive
    revision's."""

    replica_class = GenerationReplica

    def __init__(self, key: str, config: dict) -> None:
        super().__init__(key, config)
        self.tokenizer: ChatTokenizer | None = None
        self.context_length = 0
        self.next_id = 0
        self.static = self.config.get("batching") == "static"
        # Backpressure: at most this many requests wait (beyond it, 429 with Retry-After).
        slots = self.max_batch_size * max(1, int(self.config["replicas"]))
        self.max_queue = max(1, int(self.config.get("max_queue") or QUEUE_PER_SLOT * slots))
        self.seconds_per_request = 1.0  # a moving average of arrival to the last token
        self.cancelled = 0  # requests whose clients went away before their last token
        self.system_ids: dict[str, list[int]] = {}  # system prompts' tokens, recent last
        self.system_lock = threading.Lock()
        # Per process: the requests it is generating (by id), and an event set when one ends.
        self.running: list[dict[int, Waiting]] = []
        self.freed: list[asyncio.Event] = []
        # LoRA adapters by name: {"state": loading, ready or failed, "error", "bytes"}; the
        # config's spec each was loaded from, its staged directory (and the export's), and the
        # processes that have not answered its load yet.
        self.adapters: dict[str, dict] = {}
        self.adapter_specs: dict[str, dict] = {}
        self.adapter_dirs: dict[str, tuple[Path, Path]] = {}
        self.adapter_waiting: dict[str, set[int]] = {}
        self.adapter_lock = asyncio.Lock()

    async def load(self) -> None:
        await super().load()
        if self.state == "ready":
            import json

            export_dir = Path(self.config["export_dir"])
            self.tokenizer = ChatTokenizer(export_dir)
            config = json.loads((export_dir / "config.json").read_text("utf-8"))
            self.context_length = int(config.get("max_position_embeddings") or 2048)
            await self.apply_adapters()

    def adapter_state(self, name: str) -> dict | None:
        return self.adapters.get(name)

    async def set_adapters(self, specs: dict[str, dict]) -> None:
        """The config's adapters changed, and nothing else: applied without a reload."""
        self.config["adapters"] = specs
        if self.state == "ready":
            await self.apply_adapters()

    async def apply_adapters(self) -> None:
        """Bring the processes' adapters in step with the config: those removed (or changed)
        unloaded, the new ones checked, staged and loaded by every process."""
        async with self.adapter_lock:
            wanted = self.config.get("adapters") or {}
            gone = [n for n, spec in self.adapter_specs.items() if wanted.get(n) != spec]
            for name in gone:
                del self.adapter_specs[name], self.adapters[name]
                self.adapter_waiting.pop(name, None)
            if gone:
                for index in range(len(self.replicas)):
                    self._send_adapters(index, {}, gone)
                for name in gone:  # the processes hold what they loaded in memory
                    self._remove_staged(name)
            loop = asyncio.get_running_loop()
            runtime = self.manifest.get("runtime", "")
            loads = {}
            for name, spec in wanted.items():
                if name in self.adapter_specs:
                    continue
                self.adapter_specs[name] = spec
                self.adapters[name] = {"state": "loading", "error": "", "bytes": None}
                try:
                    self.adapter_dirs[name] = await loop.run_in_executor(
                        self.pool, self._stage_adapter, name, spec, runtime
                    )
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self.adapters[name].update(state="failed", error=f"{type(exc).__name__}: {exc}")
                    continue
                loads[name] = str(self.adapter_dirs[name][0])
            for index in range(len(self.replicas)):
                self._send_adapters(index, loads)

    def _stage_adapter(self, name: str, spec: dict, runtime: str) -> tuple[Path, Path]:
        """An adapter's files checked against its version's manifest (and that manifest
        against the platform's digest), staged for the processes; (staged, source)."""
        if not NAME.fullmatch(name):
            raise AdapterError(f"{name!r} is not an adapter name (a-z, 0-9, _ and -)")
        export_dir = Path(spec["export_dir"])
        expected = spec.get("manifest_sha256")
        if expected and sha256_file(export_dir / MANIFEST) != expected:
            raise ValueError(f"{export_dir / MANIFEST} is not the manifest the platform holds")
        manifest = read_manifest(export_dir, verify=False)
        if manifest.get("runtime") != runtime:
            raise AdapterError(
                f"it was trained on {manifest.get('runtime')}; this model runs on {runtime}"
            )
        adapter = manifest.get("adapter_dir")
        if not adapter:
            raise AdapterError("its version was not fine-tuned with LoRA: it has no adapter")
        for file, digest in manifest["files"].items():
            if file.startswith(adapter + "/") and sha256_file(export_dir / file) != digest:
                raise ValueError(f"{file} does not match its sha256 in the manifest")
        source = export_dir / adapter
        return stage_export(f"{self.key}-{name}", source, self.user), source

    def _remove_staged(self, name: str) -> None:
        staged, source = self.adapter_dirs.pop(name, (None, None))
        if staged is not None and staged != source:
            shutil.rmtree(staged.parent, ignore_errors=True)

    def _send_adapters(self, index: int, load: dict[str, str], unload: Sequence[str] = ()) -> None:
        if not load and not unload:
            return
        for name in load:
            self.adapter_waiting.setdefault(name, set()).add(index)
        message = {"adapters": {"load": load, "unload": list(unload)}}
        asyncio.get_running_loop().run_in_executor(
            self.pool, self._submit_quietly, self._replica_at(index), message
        )

    def _on_adapters(self, index: int, answers: dict) -> None:
        """A process's answers to the adapters it was sent: ready once every process has
        loaded one, failed (with the reason) where one could not."""
        for name, answer in answers.items():
            waiting = self.adapter_waiting.get(name)
            if waiting is None or index not in waiting:
                continue  # unloaded meanwhile
            waiting.discard(index)
            state = self.adapters[name]
            if "error" in answer:
                state.update(state="failed", error=str(answer["error"]))
            else:
                state["bytes"] = answer.get("bytes")
            if not waiting and state["state"] == "loading":
                state["state"] = "ready"

    def shared_prefix(self, messages: list[dict], prompt_ids: list[int]) -> int:
        """How many of the prompt's first tokens are its system turn's, which the requests of
        the endpoint share and the generation process prefix-caches (0 without one)."""
        if not messages or messages[0]["role"] != "system" or self.tokenizer is None:
            return 0
        system = messages[0]["content"]
        if len(system) > SYSTEM_PROMPT_CHARS:
            return 0  # not remembered: 64 of the largest bodies would be a lot of memory
        with self.system_lock:  # requests render in threads of their own
            ids = self.system_ids.pop(system, None)
        if ids is None:
            try:
                ids = self.tokenizer.encode(self.tokenizer.render(messages[:1], False))
            except Exception:  # a template that wants more than a system turn
                ids = []
        with self.system_lock:
            if len(self.system_ids) >= SYSTEM_PROMPTS:
                self.system_ids.pop(next(iter(self.system_ids)))
            self.system_ids[system] = ids
        shared = 0
        for a, b in zip(ids, prompt_ids, strict=False):
            if a != b:
                break
            shared += 1
        return shared

    def describe(self) -> dict:
        return {
            **super().describe(),
            "running": sum(len(r) for r in self.running),
            "max_queue": self.max_queue,
            "cancelled": self.cancelled,
            "adapters": self.adapters,
        }

    def retry_after(self) -> int | None:
        """None while requests may wait; when the queue is full, in how many seconds (by the
        recent requests' durations) the requests ahead are likely served."""
        waiting = self.queue.qsize()
        if waiting < self.max_queue:
            return None
        slots = self.max_batch_size * max(1, len(self.replicas))
        return max(1, math.ceil(self.seconds_per_request * waiting / slots))

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[Delta, None]:
        """The request's deltas as its batch generates them; the last has ``finish_reason``.
        Closed early (its client gone), the request leaves the queue or its batch."""
        self.next_id += 1
        request.id = self.next_id
        waiting = Waiting(request, time.monotonic())
        self.queue.put_nowait(waiting)
        finished = False
        try:
            while True:
                item = await waiting.deltas.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                waiting.gone = True
                self.cancelled += 1
                self._cancel(request.id)

    def _cancel(self, request_id: int) -> None:
        for index, running in enumerate(self.running):
            if running.pop(request_id, None) is not None:
                self.freed[index].set()
                replica = self._replica_at(index)
                asyncio.get_running_loop().run_in_executor(
                    self.pool, self._submit_quietly, replica, {"cancel": [request_id]}
                )

    @staticmethod
    def _submit_quietly(replica: GenerationReplica, message: dict) -> None:
        try:
            replica.submit(message)
        except RuntimeError:
            pass  # the process is gone: its reader fails what it held

    async def _serve(self, index: int) -> None:
        """Process ``index``'s admission loop: the oldest waiting requests join its batch
        whenever it has room (static batching: when it is empty)."""
        loop = asyncio.get_running_loop()
        self.running.append({})
        self.freed.append(asyncio.Event())
        running, freed = self.running[index], self.freed[index]
        self._start_reader(index, loop)
        while True:
            replica = self._replica_at(index)
            full = len(running) >= self.max_batch_size or (self.static and running)
            if full or not replica.alive:
                freed.clear()
                await freed.wait()
                continue
            # Into a running batch at once; into an empty one, with what comes in max_wait_ms.
            wait_s = 0.0 if running and not self.static else None
            batch = await self._collect(self.max_batch_size - len(running), wait_s)
            if not batch:
                continue
            self.batches += 1
            self.batched_inputs += len(batch)
            for w in batch:
                running[w.request.id] = w
            message = {"join": [asdict(w.request) for w in batch], "static": self.static}
            try:
                await loop.run_in_executor(self.pool, replica.submit, message)
            except RuntimeError:
                pass  # the reader sees the process gone and fails what it held

    def _replica_at(self, index: int) -> GenerationReplica:
        return cast(GenerationReplica, self.replicas[index])  # replica_class makes them

    def _start_reader(self, index: int, loop: asyncio.AbstractEventLoop) -> None:
        replica = self._replica_at(index)

        def read() -> None:  # a thread: until the process's pipe is gone
            while True:
                kind, payload = replica.read()
                try:
                    loop.call_soon_threadsafe(self._on_message, index, replica, kind, payload)
                except RuntimeError:
                    return  # the host's loop is closed: it is shutting down
                if kind == "died":
                    return

        threading.Thread(target=read, name=f"{self.key}-reader-{index}", daemon=True).start()

    def _on_message(self, index: int, replica: GenerationReplica, kind: str, payload) -> None:
        """In the event loop: a process's deltas to their requests, or its failure to all it
        held (and a dead process replaced)."""
        if replica is not self.replicas[index]:
            return  # a replaced process's last words
        running = self.running[index]
        if kind == "adapters":
            self._on_adapters(index, payload)
            return
        if kind == "rejected":
            for request_id in payload["ids"]:
                waiting = running.pop(request_id, None)
                if waiting is not None:
                    waiting.deltas.put_nowait(PredictError(payload["error"]))
            self.freed[index].set()
            return
        if kind == "step":
            for d in payload:
                delta = Delta(**d)
                waiting = running.get(delta.id)
                if waiting is None:
                    continue  # cancelled meanwhile
                waiting.deltas.put_nowait(delta)
                if delta.finish_reason is not None:
                    del running[delta.id]
                    self.freed[index].set()
                    took = time.monotonic() - waiting.arrived
                    self.seconds_per_request += 0.1 * (took - self.seconds_per_request)
            return
        why = "the revision was unloaded" if self.state == "unloading" else str(payload)
        for waiting in running.values():
            waiting.deltas.put_nowait(PredictError(why))
        running.clear()
        self.freed[index].set()
        if kind == "died" and self.state == "ready":
            asyncio.get_running_loop().create_task(self._replace(index))

    async def _replace(self, index: int) -> None:
        await self._restart(index)
        if self.state == "ready":
            self._start_reader(index, asyncio.get_running_loop())
            # The new process loads the adapters the one it replaces had.
            self._send_adapters(index, {n: str(d[0]) for n, d in self.adapter_dirs.items()})
            self.freed[index].set()

    async def unload(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait().deltas.put_nowait(PredictError("the revision was unloaded"))
        await super().unload()
        for name in list(self.adapter_dirs):
            self._remove_staged(name)
        for running in self.running:
            for waiting in running.values():
                waiting.deltas.put_nowait(PredictError("the revision was unloaded"))
            running.clear()
