"""External LLM engines: a generative revision can run on an engine that the node has (vLLM on
NVIDIA GPUs, FastDeploy on Paddle's devices) instead of the platform's own generation
processes. The serving host starts the engine's own OpenAI-compatible server on the exported
model, on a loopback port, waits for its health check, and passes each request of the
endpoint to it (``EngineRevision``), streaming the answer back with the endpoint's name.

Neither engine runs on the CPU machines the platform is tested on: the commands below are
declared from the engines' documentation. ``SERVING_ENGINE_COMMANDS`` (JSON: name →
``{"command": [...], "health": "/path", "devices": [...]}``) adds or replaces an engine, for a
site whose engine lives in a venv of its own (and for the tests, which run a stand-in server).
"""

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime import sandbox
from runtime.env import EnvError, env_float, env_str
from runtime.net import free_port
from serving.replica import ROOT, predictor_user
from serving.revision import Revision, stage_export

BUILTIN = "builtin"


def _openai_server(module: str) -> list[str]:
    """The command of an engine's OpenAI-compatible server, run as ``python -m module``."""
    return [
        "{python}",
        "-m",
        module,
        "--model",
        "{model}",
        "--served-model-name",
        "{name}",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
    ]


# name → the module that tells it is installed, the device types it serves, its command
# ({model}, {name}, {port} filled in) and its health path.
ENGINES: dict[str, dict] = {
    "vllm": {
        "module": "vllm",
        "devices": ["gpu"],
        "command": _openai_server("vllm.entrypoints.openai.api_server"),
        "health": "/health",
    },
    "fastdeploy": {
        "module": "fastdeploy",
        "devices": ["gpu", "xpu", "npu", "dcu"],
        "command": _openai_server("fastdeploy.entrypoints.openai.api_server"),
        "health": "/health",
    },
}
START_TIMEOUT_S = env_float("SERVING_ENGINE_START_TIMEOUT_S", 600.0, min=1)


def engines() -> dict[str, dict]:
    found = {name: dict(spec) for name, spec in ENGINES.items()}
    extra = env_str("SERVING_ENGINE_COMMANDS")
    if extra:
        try:
            found.update(json.loads(extra))
        except (TypeError, ValueError):
            raise EnvError(
                f"SERVING_ENGINE_COMMANDS={extra!r}: not a JSON object of engine specs"
            ) from None
    return found


def installed() -> list[str]:
    """The engines this node can start: an override's command, or the engine's module."""
    out = []
    for name, spec in engines().items():
        module = spec.get("module")
        if not module or importlib.util.find_spec(module) is not None:
            out.append(name)
    return sorted(out)


class EngineRevision(Revision):
    """A generative revision served by an external engine's OpenAI-compatible server."""

    def __init__(self, key: str, config: dict) -> None:
        super().__init__(key, config)
        self.engine = str(config.get("engine"))
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.log = Path(tempfile.gettempdir()) / f"engine-{key}-{os.getpid()}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict:
        return {**super().describe(), "engine": self.engine, "engine_url": self.url}

    async def load(self) -> None:
        import httpx

        started = time.perf_counter()
        spec = engines().get(self.engine)
        try:
            if spec is None:
                raise RuntimeError(f"no engine named {self.engine!r}; known: {sorted(engines())}")
            if self.engine not in installed():
                raise RuntimeError(f"{self.engine} is not installed on this serving host")
            self.port = free_port()
            export_dir = Path(self.config["export_dir"])
            self.user = predictor_user(self.key)
            model = await asyncio.get_running_loop().run_in_executor(
                None, stage_export, self.key, export_dir, self.user
            )
            self.staged = model if model != export_dir else None
            values = {
                "python": sys.executable,
                "model": str(model),
                "name": self.key,
                "port": str(self.port),
            }
            command = [part.format(**values) for part in spec["command"]]
            # The engine is sandboxed as the predictors are (runtime/sandbox.py).
            user = self.user
            home = model.parent if self.staged else None
            # Root's file, never opened through a link planted in its place.
            self.log.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with open(os.open(self.log, flags, 0o600), "wb") as out:
                self.process = subprocess.Popen(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=home or ROOT,
                    env=sandbox.sandbox_env({"PYTHONPATH": str(ROOT)}, home=home),
                    **user.popen_kwargs(),
                )
            deadline = time.monotonic() + START_TIMEOUT_S
            async with httpx.AsyncClient(timeout=2.0) as client:
                while True:
                    if self.state == "unloading":
                        return
                    if self.process.poll() is not None:
                        tail = self.log.read_text(errors="replace")[-1500:]
                        raise RuntimeError(
                            f"{self.engine} exited with {self.process.returncode}: {tail}"
                        )
                    try:
                        health = await client.get(self.url + spec.get("health", "/health"))
                        if health.status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.engine} did not answer in {START_TIMEOUT_S} s")
                    await asyncio.sleep(0.2)
        except Exception as exc:
            if self.state != "unloading":
                self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            self._stop_engine()
            return
        self.load_s = round(time.perf_counter() - started, 3)
        self.state = "ready"

    def _stop_engine(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.release_user()
        if self.staged is not None:
            shutil.rmtree(self.staged.parent, ignore_errors=True)

    async def unload(self) -> None:
        self.state = "unloading"
        await asyncio.get_running_loop().run_in_executor(None, self._stop_engine)
        self.pool.shutdown(wait=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None
