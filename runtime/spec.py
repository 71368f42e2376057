"""A training job as the runner sees it: ``spec.json`` in the job's work directory.

The platform (Django) writes it; the runner (``python -m runtime.run``) and the backends read
it without the ORM, so a job can run on a node that only has the files.

Work directory layout::

    spec.json            this spec
    data/{train,dev,test}.jsonl   the dataset version's rows of each split
    base/                the imported base model's files (absent for a preset)
    checkpoint/          the last checkpoint: weights, optimizer, state.json (resume point)
    best/                the best weights on the dev metric, with vocab.txt and config
    export/              the inference artifact and its manifest.json
    evaluation.json      the test split's metrics
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Hyperparameters:
    epochs: int = 3
    batch_size: int = 16
    learning_rate: float = 5e-5
    max_seq_length: int = 128
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    # Stop when the dev metric has not improved for this many evaluations; 0 never stops.
    # On by default: the best checkpoint is what gets exported, so more epochs past it only
    # cost time.
    early_stopping_patience: int = 3
    # A time budget in minutes (0: none): the runner measures its throughput, plans the steps
    # that fit (the learning rate decays to zero within them) and exports the best checkpoint.
    max_minutes: float = 0
    # The dev metric that picks the best checkpoint and drives early stopping.
    metric: str = "macro_f1"
    # Dropout of the encoder's hidden layers and attention (0 makes runs repeatable).
    dropout: float = 0.1
    # Multi-label: a label is predicted when its probability reaches this.
    threshold: float = 0.5
    # Write a checkpoint every this many steps as well as at the end of each epoch.
    checkpoint_steps: int = 200
    # Mixed precision where the device supports it (never on CPU): bfloat16 or float16.
    amp: bool = False
    amp_dtype: str = "bfloat16"
    # Generative kinds (instruction: SFT, preference: DPO) --------------------------------
    # "lora" trains low-rank adapters on the frozen base; "full" trains every weight.
    method: str = "lora"
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    # Linear layers that get adapters; empty: the architecture's default (runtime.llm).
    lora_target_modules: list[str] = field(default_factory=list)
    gradient_accumulation_steps: int = 1
    # Recompute activations in the backward pass (gradient checkpointing): less memory.
    recompute: bool = False
    # Several short conversations per sequence (SFT).
    packing: bool = False
    # DPO's temperature of the implicit reward.
    dpo_beta: float = 0.1
    # Instruction rows rated below this by annotators (1–5) do not train; 0 keeps all.
    min_rating: int = 0
    # Generations for held-out prompts in the evaluation.
    max_new_tokens: int = 64
    eval_generations: int = 20
    # Masked language modelling (objective "mlm", runtime.mlm): the share of characters
    # predicted (BERT's 15%: 80% [MASK], 10% a random character, 10% unchanged).
    mlm_probability: float = 0.15
    # Compression (objective "int8", runtime.compress): "dynamic" or "static" quantization,
    # and the dev rows that calibrate a static one.
    quantization: str = "dynamic"
    calibration_rows: int = 200

    @classmethod
    def from_dict(cls, data: dict) -> "Hyperparameters":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown hyperparameter(s): {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass
class JobSpec:
    job_id: int
    task_kind: str
    labels: list[str]
    backend: str = "paddle"
    # "" trains the task kind's model; "mlm" pretrains an encoder on the texts (runtime.mlm);
    # "int8" quantizes the model in ``parent/`` (runtime.compress); "distill" trains the
    # preset on what that model decides (runtime.distill).
    objective: str = ""
    # A preset name (a small model built from a config) or the imported base model's files.
    preset: str | None = None
    base_model_dir: str | None = None
    # The preset's architecture (hidden size, layers…) when ``preset`` is set.
    model_config: dict = field(default_factory=dict)
    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    device_type: str = "cpu"
    # The framework's name of the device type (its hardware profile's paddle_device: Hygon's
    # DCU is "gpu" on the ROCm build).
    device: str = "cpu"
    device_count: int = 1
    # The variable through which the job sees only its own cards (CUDA_VISIBLE_DEVICES…).
    visibility_env: str = ""

    @property
    def hp(self) -> Hyperparameters:
        return self.hyperparameters

    def save(self, workdir: Path) -> None:
        # A new file, never through a link a runner left in its place (the platform writes
        # it as root on a re-attempt).
        path = workdir / "spec.json"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(asdict(self), ensure_ascii=False, indent=2))

    @classmethod
    def load(cls, workdir: Path) -> "JobSpec":
        data = json.loads((workdir / "spec.json").read_text(encoding="utf-8"))
        data["hyperparameters"] = Hyperparameters.from_dict(data.get("hyperparameters", {}))
        return cls(**data)
