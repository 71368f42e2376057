"""The torch backend: Hugging Face Transformers heads per task kind, exported to ONNX for
onnxruntime.

- text_classification, text_pair: ``*ForSequenceClassification``, cross-entropy;
- multi_label: the same head, binary cross-entropy on the logits (sigmoid and threshold at
  prediction);
- ner: ``*ForTokenClassification`` over BIO tags, one token per character.

A preset is a ``BertConfig`` built from its architecture (ERNIE 3.0 is BERT-shaped); an imported
base model is a Hugging Face checkpoint (BERT, RoBERTa-wwm Chinese, ERNIE…) loaded through the
``Auto*`` classes, from its directory only.
"""

import inspect
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.backends import LoopBackend
from runtime.data import IGNORE, MULTI, SINGLE, TOKEN, LabelSpace
from runtime.loop import BEST, VOCAB
from runtime.presets import PRESETS
from runtime.spec import JobSpec
from runtime.weights import refuse_pickles

if TYPE_CHECKING:  # imported in llm_ops: it imports this module
    from runtime.backends.torch_llm import TorchLLMOps

# Training nodes are offline: a missing file must fail, not start a download from the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
OPTIMIZER = "optimizer"  # optimizer.safetensors + optimizer.json (runtime.weights.save_state)
ONNX_FILE = "model.onnx"
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
# Weight files of a Hugging Face (PyTorch) checkpoint; a PaddleNLP one has model_state.pdparams.
HF_WEIGHTS = (WEIGHTS, WEIGHTS_INDEX, "pytorch_model.bin", "pytorch_model.bin.index.json")
# PaddleNLP's names of the preset keys that BertConfig names otherwise.
BERT_NAMES = {"dropout": "classifier_dropout"}
# Set from the arguments (vocabulary, label space), never from the preset.
FROM_ARGUMENTS = {"vocab_size", "num_labels", "num_classes"}
ONNX_OPSET = 17


def torch_device(device: str) -> Any:
    """torch's device for the job's device string (its profile's Paddle device: "gpu" for
    NVIDIA's CUDA and Hygon's ROCm builds alike; "cpu" on a simulated node)."""
    import torch

    if device == "cpu":
        return torch.device("cpu")
    if device == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("the job asks for a gpu but this torch build sees no CUDA device")
        # Under torchrun, each process its own card (of those the job may see).
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    raise ValueError(
        f"the torch backend does not run on the device {device!r}: only cpu and gpu (CUDA, ROCm)"
    )


def head_classes(head: str, auto: bool) -> Any:
    from transformers.utils import is_torch_available

    # transformers decides once, at its import, whether torch exists: USE_TORCH=0 in the
    # environment then (the paddle backend sets it) leaves only placeholder model classes.
    if not is_torch_available():
        raise RuntimeError(
            "transformers was imported with torch disabled (USE_TORCH="
            f"{os.environ.get('USE_TORCH')!r}); run the torch backend in a process that has "
            "not loaded the paddle backend first"
        )
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        BertForSequenceClassification,
        BertForTokenClassification,
    )

    if auto:
        token, sequence = AutoModelForTokenClassification, AutoModelForSequenceClassification
    else:
        token, sequence = BertForTokenClassification, BertForSequenceClassification
    return token if head == TOKEN else sequence


def check_checkpoint(directory: Path) -> None:
    """A clear error for a base model this backend cannot read (a PaddleNLP one, say)."""
    if not (directory / "config.json").is_file() or not any(
        (directory / name).is_file() for name in HF_WEIGHTS
    ):
        raise ValueError(
            f"{directory} is not a Hugging Face checkpoint (config.json and one of "
            f"{', '.join(HF_WEIGHTS)}); the torch backend needs one, the paddle backend reads "
            "PaddleNLP checkpoints"
        )


def save_torch_state(directory: Path, tree: Any) -> None:
    """An optimizer's state as safetensors and JSON: nothing the runner reads is a pickle."""
    import torch
    from safetensors.torch import save_file

    from runtime.weights import save_state

    def as_array(value: Any) -> Any:
        return value.detach().contiguous() if isinstance(value, torch.Tensor) else None

    save_state(directory / OPTIMIZER, tree, as_array, save_file)


def load_torch_state(directory: Path, device: Any) -> Any:
    from safetensors.torch import load_file

    from runtime.weights import load_state

    return load_state(directory / OPTIMIZER, lambda path: load_file(str(path), device=str(device)))


def bert_config(spec: JobSpec, vocab_size: int, num_labels: int) -> Any:
    from transformers import BertConfig

    assert spec.preset, "a spec without a base model names a preset"
    arch = {**PRESETS[spec.preset], **spec.model_config}
    arch = {BERT_NAMES.get(k, k): v for k, v in arch.items() if k not in FROM_ARGUMENTS}
    arch.update(hidden_dropout_prob=spec.hp.dropout, attention_probs_dropout_prob=spec.hp.dropout)
    return BertConfig(vocab_size=vocab_size, num_labels=num_labels, **arch)


def accepts_token_types(model: Any) -> bool:
    return "token_type_ids" in inspect.signature(model.forward).parameters


class TorchOps:
    def build(self, spec: JobSpec, space: LabelSpace, vocab_size: int) -> None:
        import torch

        self.device = torch_device(spec.device)
        torch.manual_seed(spec.hp.seed)  # the head's (or the preset's) initial weights
        self.head = space.head
        if spec.base_model_dir:
            base = Path(spec.base_model_dir)
            check_checkpoint(base)
            refuse_pickles(base)
            self.model = head_classes(space.head, auto=True).from_pretrained(
                str(base),
                num_labels=space.num_outputs,
                local_files_only=True,
                # the checkpoint's own head (if any) has another number of labels
                ignore_mismatched_sizes=True,
                hidden_dropout_prob=spec.hp.dropout,
                attention_probs_dropout_prob=spec.hp.dropout,
                use_safetensors=True,
            )
        else:
            config = bert_config(spec, vocab_size, space.num_outputs)
            self.model = head_classes(space.head, auto=False)(config)
        self.model.to(self.device)
        self.token_types = accepts_token_types(self.model)
        decay: list[Any] = []
        no_decay: list[Any] = []
        for name, param in self.model.named_parameters():
            lowered = name.lower()
            skip = "bias" in lowered or "layernorm" in lowered or "layer_norm" in lowered
            (no_decay if skip else decay).append(param)
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": spec.hp.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=spec.hp.learning_rate,
        )
        self.amp = spec.hp.amp and self.device.type != "cpu"
        self.amp_dtype = torch.bfloat16 if spec.hp.amp_dtype == "bfloat16" else torch.float16
        # float16's narrow range needs the loss scaled; bfloat16 has float32's range.
        use_scaler = self.amp and self.amp_dtype == torch.float16
        self.scaler = torch.amp.GradScaler(self.device.type) if use_scaler else None
        self.model.train()
        # Several processes (torchrun): gradients are averaged across them (gloo between CPU
        # processes, NCCL between cards).
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.rank = int(os.environ.get("RANK", 0))
        self.trained = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            torch.distributed.init_process_group("gloo" if self.device.type == "cpu" else "nccl")
            ids = None if self.device.type == "cpu" else [self.device.index]
            self.trained = DistributedDataParallel(self.model, device_ids=ids)

    def _forward(self, batch: dict[str, np.ndarray], model: Any = None) -> Any:
        import torch

        feed = {
            name: torch.from_numpy(batch[name]).to(self.device)
            for name in INPUT_NAMES
            if name != "token_type_ids" or self.token_types
        }
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            logits = (model or self.model)(**feed).logits
        return logits.float()  # losses and outputs in float32 under AMP too

    def _loss(self, logits: Any, labels: np.ndarray) -> Any:
        import torch
        import torch.nn.functional as F

        target = torch.from_numpy(labels).to(self.device)
        if self.head == SINGLE:
            return F.cross_entropy(logits, target)
        if self.head == MULTI:
            return F.binary_cross_entropy_with_logits(logits, target.float())
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE
        )

    def train_step(self, batch: dict[str, np.ndarray], lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = self._loss(self._forward(batch, self.trained), batch["labels"])
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss.detach()
        if self.world > 1:  # the loss of the whole batch: the mean of the processes' shares
            import torch

            torch.distributed.all_reduce(loss)
            return float(loss) / self.world
        return float(loss)

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        self.model.eval()
        with torch.no_grad():
            out = self._forward(batch).cpu().numpy()
        self.model.train()
        return out

    def agree_max(self, value: float) -> float:
        """The largest ``value`` of the job's processes (a time budget's measurements)."""
        import torch

        tensor = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor[0])

    def save(self, directory: Path, with_optimizer: bool) -> None:

        self.model.save_pretrained(str(directory), safe_serialization=True)
        if with_optimizer:
            save_torch_state(directory, self.optimizer.state_dict())

    def load(self, directory: Path, with_optimizer: bool) -> None:
        from safetensors.torch import load_file

        index = directory / WEIGHTS_INDEX
        files = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.is_file()  # save_pretrained shards a large model
            else [WEIGHTS]
        )
        state: dict[str, Any] = {}
        for name in files:
            state.update(load_file(str(directory / name), device=str(self.device)))
        self.model.load_state_dict(state)
        if with_optimizer:
            self.optimizer.load_state_dict(load_torch_state(directory, self.device))


def logits_module(model: Any) -> Any:
    """``model`` as a module of the three named inputs that returns only the logits: the
    graph's inputs and output get the names the runtime feeds and reads."""
    import torch

    token_types = accepts_token_types(model)

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, token_type_ids, attention_mask):
            extra = {"token_type_ids": token_type_ids} if token_types else {}
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits

    return LogitsOnly().eval()


class TorchBackend(LoopBackend):
    name = "torch"
    runtime = "onnxruntime"
    generative_runtime = "torch_generate"

    def model_ops(self) -> TorchOps:
        return TorchOps()

    def llm_ops(self) -> "TorchLLMOps":
        from runtime.backends.torch_llm import TorchLLMOps

        return TorchLLMOps()

    def export_classifier(self, spec: JobSpec, workdir: Path, out_dir: Path) -> dict[str, str]:
        import torch

        head = LabelSpace(spec.task_kind, tuple(spec.labels)).head
        # Eager attention: the SDPA path's mask handling does not trace to a portable graph.
        model = head_classes(head, auto=True).from_pretrained(
            str(workdir / BEST),
            local_files_only=True,
            attn_implementation="eager",
            use_safetensors=True,
        )
        module = logits_module(model.to("cpu").float())
        # A batch of two with a padded row, so nothing specialises on batch 1 or a full mask.
        ids = torch.full((2, 8), 1, dtype=torch.int64)
        types = torch.zeros_like(ids)
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0
        axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
        axes["logits"] = {0: "batch", 1: "sequence"} if head == TOKEN else {0: "batch"}
        # torch ≥ 2.9 defaults to the dynamo exporter, which needs onnxscript; the TorchScript
        # one needs nothing more and handles these encoders.
        legacy = (
            {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
        )
        with warnings.catch_warnings(), torch.no_grad():
            # the TorchScript exporter is chosen on purpose: its deprecation notice is noise
            for notice in ("You are using the legacy TorchScript", "The feature will be removed"):
                warnings.filterwarnings("ignore", notice, DeprecationWarning)
            torch.onnx.export(
                module,
                (ids, types, mask),
                str(out_dir / ONNX_FILE),
                input_names=list(INPUT_NAMES),
                output_names=["logits"],
                dynamic_axes=axes,
                opset_version=ONNX_OPSET,
                **legacy,
            )
        shutil.copy(workdir / BEST / VOCAB, out_dir / VOCAB)
        return {"model_file": ONNX_FILE}
