"""Models trained once per session by the real runner (the preset, the paddle backend, the
export with its manifest), a real serving host process, and helpers to call it."""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
from django.conf import settings

from tests.helpers.data import rows_for
from tests.helpers.system import ROOT

LABELS = {
    "text_classification": ["正面", "负面"],
    "multi_label": ["好评", "差评", "物流"],
    "text_pair": ["相似", "不相似"],
    "ner": ["地点"],
}


def train_export(
    kind: str, workdir: Path, seed: int = 0, epochs: int = 8, backend: str = "paddle"
) -> Path:
    """Train the default preset on keyword rows with the job runner; the export directory
    (Paddle Inference for the paddle backend, ONNX for torch)."""
    from runtime.spec import Hyperparameters, JobSpec

    rows, _mapping = rows_for(kind, 80, seed=seed)
    data = workdir / "data"
    data.mkdir(parents=True)
    for split, part in (("train", rows[:64]), ("dev", rows[64:72]), ("test", rows[72:])):
        with open(data / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
    (data / ".complete").touch()
    JobSpec(
        job_id=seed + 1,
        task_kind=kind,
        labels=LABELS[kind],
        backend=backend,
        preset="ernie-micro-char",
        hyperparameters=Hyperparameters(
            epochs=epochs, batch_size=16, learning_rate=1e-3, max_seq_length=64, seed=seed
        ),
    ).save(workdir)
    _run_runner(workdir, backend)
    return workdir / "export"


def train_llm_export(kind: str, workdir: Path, backend: str = "paddle") -> Path:
    """The tiny LLaMA preset fine-tuned with LoRA by the job runner on the sums in words of
    ``rows_for`` (instruction: SFT; preference: DPO); its merged export."""
    from runtime.presets import recommended
    from runtime.spec import JobSpec

    rows, _mapping = rows_for(kind, 81)
    data = workdir / "data"
    data.mkdir(parents=True)
    for split, part in (("train", rows[:65]), ("dev", rows[65:73]), ("test", rows[73:])):
        with open(data / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
    hp = recommended(kind, preset="llama-tiny-char")
    hp.epochs, hp.eval_generations, hp.checkpoint_steps = 6, 4, 0
    JobSpec(
        job_id=1,
        task_kind=kind,
        labels=[],
        backend=backend,
        preset="llama-tiny-char",
        hyperparameters=hp,
    ).save(workdir)
    _run_runner(workdir, backend)
    return workdir / "export"


def _run_runner(workdir: Path, backend: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if backend == "paddle":  # as training.launch.runner_env: no torch import for paddle
        env.update(USE_TORCH="0", USE_TF="0")
    for var in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL"):
        env.pop(var, None)
    proc = subprocess.run(
        [settings.TRAINING_PYTHON, "-m", "runtime.run", str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.fixture(scope="session")
def llm_exports(tmp_path_factory):
    """Generative exports by (kind, backend), trained on first use."""
    cache: dict[tuple[str, str], Path] = {}

    def get(kind: str = "instruction", backend: str = "paddle") -> Path:
        if (kind, backend) not in cache:
            workdir = tmp_path_factory.mktemp(f"llm-{kind}-{backend}")
            cache[(kind, backend)] = train_llm_export(kind, workdir, backend)
        return cache[(kind, backend)]

    return get


def train_lora_export(workdir: Path, base: Path, kind: str, rows: list[dict]) -> Path:
    """A LoRA fine-tuning of the imported base model ``base`` (paddle) by the job runner;
    its export (the adapter merged, and beside it alone)."""
    from tests.helpers.workdir import lora_workdir

    _run_runner(lora_workdir(workdir, kind, rows, "paddle", base), "paddle")
    return workdir / "export"


@pytest.fixture(scope="session")
def lora_exports(django_db_setup, tmp_path_factory) -> dict[str, Path]:
    """Two LoRA versions of one imported tiny Qwen2 (paddle, with Qwen2's chat template and
    special tokens): "sums" (SFT on sums) and "prefs" (DPO on preference pairs)."""
    from tests.helpers.models import chat_model_dir
    from tests.runtime.test_architectures import preferences
    from tests.runtime.test_llm_runner import sums

    base = chat_model_dir("qwen2", "paddle")
    return {
        "sums": train_lora_export(
            tmp_path_factory.mktemp("lora-sums"), base, "instruction", sums(40)
        ),
        "prefs": train_lora_export(
            tmp_path_factory.mktemp("lora-prefs"), base, "preference", preferences(24)
        ),
    }


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """Exports by (kind, seed, backend), trained on first use."""
    cache: dict[tuple[str, int, str], Path] = {}

    def get(kind: str = "text_classification", seed: int = 0, backend: str = "paddle") -> Path:
        if (kind, seed, backend) not in cache:
            workdir = tmp_path_factory.mktemp(f"train-{kind}-{seed}-{backend}")
            cache[(kind, seed, backend)] = train_export(kind, workdir, seed, backend=backend)
        return cache[(kind, seed, backend)]

    return get


@pytest.fixture(scope="session")
def int8_exports(exports, tmp_path_factory):
    """Those exports compressed to INT8 by the job runner (objective "int8"), on first use."""
    import shutil

    from runtime.spec import JobSpec

    cache: dict[tuple[str, int], Path] = {}

    def get(kind: str = "text_classification", seed: int = 0) -> Path:
        if (kind, seed) not in cache:
            trained = exports(kind, seed).parent
            workdir = tmp_path_factory.mktemp(f"int8-{kind}-{seed}")
            shutil.copytree(trained / "data", workdir / "data")
            for part in ("export", "targets"):
                shutil.copytree(trained / part, workdir / "parent" / part)
            spec = JobSpec.load(trained)
            spec.objective = "int8"
            spec.save(workdir)
            _run_runner(workdir, "paddle")
            cache[(kind, seed)] = workdir / "export"
        return cache[(kind, seed)]

    return get


@pytest.fixture
def model_version(team, owner, exports, int8_exports, llm_exports, tmp_path):
    """Register a trained export as a ModelVersion of ``team`` (its files in storage); the
    generative kinds' exports are the tiny LLaMA's."""
    import shutil

    from runtime.inference import read_manifest
    from training import storage
    from training.models import ModelVersion

    def make(
        kind: str = "text_classification",
        seed: int = 0,
        name: str = "reviews",
        int8=False,
        export: Path | None = None,
        base: str = "",
    ):
        """``export``: that one (fine-tuned from the base model named ``base``)."""
        generative = kind in ("instruction", "preference")
        if export is None:
            export = llm_exports(kind) if generative else exports(kind, seed)
        if int8:
            export = int8_exports(kind, seed)
        staged = tmp_path / uuid.uuid4().hex
        shutil.copytree(export, staged / "export")
        prefix = f"models/{uuid.uuid4().hex}/"
        files = storage.store_dir(staged, prefix)
        manifest = read_manifest(staged / "export", verify=False)
        number = ModelVersion.objects.filter(team=team, name=name).count() + 1
        return ModelVersion.objects.create(
            team=team,
            name=name,
            number=number,
            task_kind=kind,
            labels=manifest["labels"],
            backend="paddle",
            runtime=manifest["runtime"],
            base=base or ("llama-tiny-char" if generative else "ernie-micro-char"),
            manifest=manifest,
            storage_prefix=prefix,
            files=files,
            created_by=owner,
        )

    return make


class ServingHostProcess:
    """``python -m serving`` on the suite's SERVING_PORT, in the runtime venv."""

    def __init__(self) -> None:
        self.port = settings.SERVING_PORT
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SERVING_SECRET": settings.SERVING_SECRET,
            # A stand-in engine server for the tests of engine revisions (test_engines.py).
            "SERVING_ENGINE_COMMANDS": json.dumps(
                {
                    "fake": {
                        "command": [
                            "{python}",
                            str(ROOT / "tests" / "deployment" / "fake_engine.py"),
                            "--model",
                            "{model}",
                            "--served-model-name",
                            "{name}",
                            "--port",
                            "{port}",
                        ],
                        "health": "/health",
                        "devices": ["cpu"],
                    }
                }
            ),
        }
        self.proc = subprocess.Popen(
            [settings.TRAINING_PYTHON, "-m", "serving", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(self.url + "/healthz", timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the serving host did not start (exit code {self.proc.poll()})")
            time.sleep(0.2)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def manage(self, method: str, path: str, body=None) -> requests.Response:
        return requests.request(
            method,
            self.url + path,
            json=body,
            headers={"Authorization": f"Bearer {settings.SERVING_SECRET}"},
            timeout=30,
        )

    def state(self) -> dict:
        return self.manage("GET", "/manage/state").json()

    def wait_ready(self, key: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            rev = self.state()["revisions"].get(key)
            if rev and rev["state"] in ("ready", "failed"):
                return rev
            assert time.monotonic() < deadline, f"{key} is not ready: {rev}"
            time.sleep(0.2)

    def predict(
        self, name: str, body, key: str | None = None, headers: dict | None = None, **kwargs
    ) -> requests.Response:
        """Call endpoint ``name`` with ``key`` (or with ``headers``, as they are)."""
        if headers is None:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
        return requests.post(
            f"{self.url}/v1/endpoints/{name}:predict",
            json=body,
            headers=headers,
            timeout=60,
            **kwargs,
        )


@pytest.fixture(scope="session")
def serving_host():
    host = ServingHostProcess()
    host.start()
    yield host
    host.stop()


@pytest.fixture
def fresh_host(serving_host):
    """The suite's serving host with nothing loaded and no endpoint routed."""
    if serving_host.proc.poll() is not None:
        serving_host.start()
    state = serving_host.state()
    for name in state["endpoints"]:
        serving_host.manage("DELETE", f"/manage/endpoints/{name}")
    for key in state["revisions"]:
        serving_host.manage("DELETE", f"/manage/revisions/{key}")
    return serving_host
