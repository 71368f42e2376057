"""A revision on the serving host: its predictor processes and the dynamic batcher feeding them.

Every input of every request goes into one queue. Each replica has a loop that, when its
process is free, takes the oldest input and then more until ``max_batch_size`` inputs are in
hand or ``max_wait_ms`` has passed since the oldest arrived, runs them as one batch (padded to
the longest, ``runtime.data.collate``) and answers each input's future. While every replica is
busy, inputs wait in the queue, so the next batch fills at once: under load batches are full
without waiting, and alone a request waits at most ``max_wait_ms``.
"""

import asyncio
import os
import re
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime import sandbox
from runtime.env import env_path
from runtime.inference import MANIFEST, read_manifest, sha256_file
from serving.replica import Replica, predictor_user


@dataclass
class Pending:
    item: object
    future: asyncio.Future
    arrived: float

    def wanted(self) -> bool:
        return not self.future.done()  # a client that left is skipped


def _expire(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(TimeoutError())


class PredictError(Exception):
    """The revision could not answer (a predictor process failed or died)."""


def staging_dir() -> Path:
    """Where the host stages the models its predictors read, when they run as another user:
    SERVING_WORK_DIR, else a directory of this host process's under the temporary one."""
    path = env_path("SERVING_WORK_DIR", tempfile.gettempdir()) / f"staged-{os.getpid()}"
    path.mkdir(mode=0o711, parents=True, exist_ok=True)
    sandbox.make_traversable(path)
    return path


def stage_export(key: str, export_dir: Path, user: sandbox.RunnerUser | None = None) -> Path:
    """The export as the revision's predictors read it: ``export_dir`` itself, or where the
    host runs as root, a copy the predictors' user can read (the platform's storage is not
    readable by it)."""
    user = user or predictor_user()
    if not user.switch:
        return export_dir
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", key) + "-" + uuid.uuid4().hex[:8]
    target = staging_dir() / name
    return sandbox.stage_readable(user, export_dir, target)


# A revision's settings as the platform sends them; a different config means a reload.
DEFAULTS = {"device": "cpu", "replicas": 1, "max_batch_size": 32, "max_wait_ms": 5.0}


class Revision:
    replica_class = Replica

    def __init__(self, key: str, config: dict) -> None:
        self.key = key
        self.config = {**DEFAULTS, **config}
        self.state = "loading"
        self.error = ""
        self.manifest: dict = {}
        self.replicas: list[Replica] = []
        # Pending items; a generative revision's own kind (generative.Waiting) in one.
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.loops: list[asyncio.Task] = []
        self.pool = ThreadPoolExecutor(max_workers=int(self.config["replicas"]) + 1)
        self.load_s: float | None = None
        self.batches = 0
        self.batched_inputs = 0
        # Seconds the batched inputs waited in the queue, added up (a mean with batched_inputs).
        self.queue_wait_s = 0.0
        # The export the predictor processes read (a staged copy where they run as another user).
        self.staged: Path | None = None
        # Whom its processes run as (a uid of its own where the host is root), claimed at load.
        self.user: sandbox.RunnerUser | None = None

    @property
    def max_batch_size(self) -> int:
        return max(1, int(self.config["max_batch_size"]))

    @property
    def max_wait_s(self) -> float:
        return max(0.0, float(self.config["max_wait_ms"])) / 1000

    def describe(self) -> dict:
        return {
            "state": self.state,
            "error": self.error,
            "config": self.config,
            "replicas_ready": sum(r.alive for r in self.replicas) if self.state == "ready" else 0,
            "load_s": self.load_s,
            "queued": self.queue.qsize(),
            "batches": self.batches,
            "batched_inputs": self.batched_inputs,
        }

    async def load(self) -> None:
        started = time.perf_counter()
        try:
            export_dir = Path(self.config["export_dir"])
            expected = self.config.get("manifest_sha256")
            if expected and sha256_file(export_dir / MANIFEST) != expected:
                raise ValueError(f"{export_dir / MANIFEST} is not the manifest the platform holds")
            # The replicas check every file's sha256; here only what validation needs.
            self.manifest = read_manifest(export_dir, verify=False)
            loop = asyncio.get_running_loop()
            self.user = predictor_user(self.key)
            self.staged = await loop.run_in_executor(
                self.pool, stage_export, self.key, export_dir, self.user
            )
            self.replicas = [self._replica() for _ in range(max(1, int(self.config["replicas"])))]
            await asyncio.gather(
                *(loop.run_in_executor(self.pool, r.wait_ready) for r in self.replicas)
            )
        except Exception as exc:
            if self.state != "unloading":
                self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            await self._stop_replicas()
            return
        if self.state == "unloading":  # unloaded while it warmed up
            await self._stop_replicas()
            return
        self.loops = [asyncio.create_task(self._serve(i)) for i in range(len(self.replicas))]
        self.load_s = round(time.perf_counter() - started, 3)
        self.state = "ready"

    def _replica(self) -> Replica:
        export_dir = self.staged or Path(self.config["export_dir"])
        return self.replica_class(
            str(export_dir), str(self.config["device"]), self.max_batch_size, self.user
        )

    async def predict(self, items: list, timeout_s: float) -> list[dict]:
        """Each item's prediction; TimeoutError after ``timeout_s`` (a hung predictor), its
        items then skipped by the batcher."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        futures = []
        for item in items:
            future = loop.create_future()
            self.queue.put_nowait(Pending(item, future, now))
            futures.append(future)
        # One timer, not asyncio.timeout's task machinery: this runs for every request.
        timer = loop.call_later(timeout_s, _expire, futures)
        try:
            if len(futures) == 1:  # most requests: no gather's task and callbacks
                return [await futures[0]]
            return list(await asyncio.gather(*futures))
        finally:
            timer.cancel()

    async def _collect(self, room: int = 0, wait_s: float | None = None) -> list:
        """The oldest waiting item, then those already queued, then those that come within
        ``wait_s`` (``max_wait_ms``) of it, up to ``room`` (``max_batch_size``); those still
        wanted."""
        first = await self.queue.get()
        batch = [first]
        deadline = first.arrived + (self.max_wait_s if wait_s is None else wait_s)
        room = room or self.max_batch_size
        while len(batch) < room:
            if not self.queue.empty():
                batch.append(self.queue.get_nowait())
                continue
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), timeout))
            except TimeoutError:
                break
        now = time.monotonic()
        self.queue_wait_s += sum(now - p.arrived for p in batch)
        return [p for p in batch if p.wanted()]

    async def _serve(self, index: int) -> None:
        while True:
            batch = await self._collect()
            if not batch:
                continue
            replica = self.replicas[index]
            self.batches += 1
            self.batched_inputs += len(batch)
            try:
                await self._run(replica, batch)
            except asyncio.CancelledError:
                self._fail(batch, PredictError("the revision was unloaded"))
                raise
            except RuntimeError as exc:
                self._fail(batch, PredictError(str(exc)))
                if not replica.alive:
                    await self._restart(index)

    async def _run(self, replica: Replica, batch: list[Pending]) -> None:
        """One batch on one process: every input's future gets its prediction."""
        loop = asyncio.get_running_loop()
        preds = await loop.run_in_executor(self.pool, replica.call, [p.item for p in batch])
        for p, pred in zip(batch, preds, strict=True):
            if not p.future.done():
                p.future.set_result(pred)

    def _fail(self, batch: list[Pending], error: PredictError) -> None:
        for p in batch:
            if not p.future.done():
                p.future.set_exception(error)

    async def _restart(self, index: int) -> None:
        """A predictor process died: start another; the others go on serving meanwhile."""
        if self.state != "ready":
            return  # being unloaded: its processes are stopping
        loop = asyncio.get_running_loop()
        replica = self._replica()
        try:
            await loop.run_in_executor(self.pool, replica.wait_ready)
        except RuntimeError as exc:
            replica.stop()
            self.state, self.error = (
                "failed",
                f"a predictor process died and did not restart: {exc}",
            )
            return
        self.replicas[index] = replica

    async def _stop_replicas(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.pool, r.stop) for r in self.replicas))
        self.release_user()
        if self.staged is not None and self.staged != Path(self.config["export_dir"]):
            shutil.rmtree(self.staged.parent, ignore_errors=True)

    def release_user(self) -> None:
        """Every process left of the revision's uid is killed (what a predictor left behind,
        setsid or not), and the uid is free again."""
        if self.user is not None:
            sandbox.release_user(self.user)
            self.user = None

    async def unload(self) -> None:
        self.state = "unloading"
        for task in self.loops:
            task.cancel()
        while not self.queue.empty():
            p = self.queue.get_nowait()
            if not p.future.done():
                p.future.set_exception(PredictError("the revision was unloaded"))
        await self._stop_replicas()
        self.pool.shutdown(wait=False)
