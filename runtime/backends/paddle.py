"""The paddle backend (default): PaddleNLP ERNIE heads per task kind, or a fast preset's model
(``runtime.backends.paddle_models``), exported with ``paddle.jit.save`` for Paddle Inference.

- text_classification, text_pair: ``ErnieForSequenceClassification``, cross-entropy;
- multi_label: the same head, a sigmoid and binary cross-entropy (threshold at prediction);
- ner: ``ErnieForTokenClassification`` over BIO tags, one token per character; a fast
  preset's BiGRU-CRF takes the CRF's likelihood instead.
"""

import json
import linecache
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.backends import LoopBackend
from runtime.data import IGNORE, MULTI, SINGLE, TOKEN, LabelSpace
from runtime.inference import flush_denormals
from runtime.loop import BEST, VOCAB
from runtime.presets import is_fast, preset_config
from runtime.spec import JobSpec
from runtime.weights import refuse_pickles

if TYPE_CHECKING:  # imported in llm_ops: it imports this module
    from runtime.backends.paddle_llm import PaddleLLMOps

WEIGHTS = "model.safetensors"  # PaddleNLP's safetensors name (save_pretrained, from_pretrained)
OPTIMIZER = "optimizer"  # optimizer.safetensors + optimizer.json (runtime.weights.save_state)


def save_paddle_state(directory: Path, tree) -> None:
    """An optimizer's state as safetensors and JSON: nothing the runner reads is a pickle."""
    import paddle
    from safetensors.numpy import save_file

    from runtime.weights import save_state

    def as_array(value):
        return value.numpy() if isinstance(value, paddle.Tensor) else None

    save_state(directory / OPTIMIZER, tree, as_array, save_file)


def load_paddle_state(directory: Path):
    import paddle
    from safetensors.numpy import load_file

    from runtime.weights import load_state

    return load_state(
        directory / OPTIMIZER,
        lambda path: {k: paddle.to_tensor(v) for k, v in load_file(str(path)).items()},
    )


def load_paddle_weights(directory: Path) -> dict:
    """The safetensors weights of a directory (one file, or the shards of its index)."""
    import json

    from safetensors.numpy import load_file

    index = directory / (WEIGHTS + ".index.json")
    names = (
        sorted(set(json.loads(index.read_text("utf-8"))["weight_map"].values()))
        if index.is_file()
        else [WEIGHTS]
    )
    state: dict = {}
    for name in names:
        state.update(load_file(str(directory / name)))
    return state


def paddle_device(spec: JobSpec) -> str:
    """The device of this process: the visibility variable leaves the job only its cards, and
    Paddle's launcher gives each process of a multi-device job its own."""
    if spec.device == "cpu" or spec.device_count > 1:
        return spec.device
    return f"{spec.device}:0"


class PaddleCheckpointed:
    """Saving and loading of a paddle model (``save_pretrained``'s safetensors) and its
    optimizer's state, alike for every paddle ops."""

    model: Any
    optimizer: Any

    def save_model(self, directory: Path) -> None:
        self.model.save_pretrained(str(directory), safe_serialization=True)

    def save(self, directory: Path, with_optimizer: bool) -> None:
        self.save_model(directory)
        if with_optimizer:
            save_paddle_state(directory, self.optimizer.state_dict())

    def load(self, directory: Path, with_optimizer: bool) -> None:
        self.model.set_state_dict(load_paddle_weights(directory))
        if with_optimizer:
            self.optimizer.set_state_dict(load_paddle_state(directory))


def pin_sources(model: Any) -> None:
    """Keep the source of the model's code as this process loaded it. Paddle's export
    (dy2static) reads each layer's ``forward`` from its file, at the end of the job: an upgrade
    that replaced the file since would have it convert other lines (or fail, "Function: forward
    doesn't exist…"). Linecache keeps an entry without a modification time as it is."""
    paths = {
        getattr(sys.modules.get(type(x).__module__), "__file__", None)
        for x in [model, *model.sublayers()]
    }
    for path in filter(None, paths):
        lines = linecache.getlines(path)
        if lines:
            linecache.cache[path] = (sum(map(len, lines)), None, lines, path)


class PaddleOps(PaddleCheckpointed):
    # A fast preset's config.json (runtime.backends.paddle_models); None for an ERNIE model.
    fast_config: dict | None = None
    # The training examples' ids (``size_to``).
    training_ids: Sequence[list[int]] = ()

    def build(self, spec: JobSpec, space: LabelSpace, vocab_size: int) -> None:
        import paddle
        from paddlenlp.utils.log import logger

        logger.set_level("WARNING")  # not a log line per saved file
        flush_denormals()
        paddle.set_device(paddle_device(spec))
        paddle.seed(spec.hp.seed)
        self.world = paddle.distributed.get_world_size()
        self.rank = paddle.distributed.get_rank()
        self.head = space.head
        if is_fast(spec.preset):
            from runtime.backends import paddle_models

            self.fast_config = {
                **preset_config(spec.preset or ""),
                **spec.model_config,
                "vocab_size": vocab_size,
                "num_labels": space.num_outputs,
                "dropout": spec.hp.dropout,
            }
            if self.fast_config["architecture"] == "ngram_bag":
                self.fast_config["pair"] = spec.task_kind == "text_pair"
            most = self.fast_config.get("wide_buckets")
            if most and self.fast_config["architecture"] == "ngram_bag":
                self.fast_config["wide_buckets"] = paddle_models.sized_buckets(
                    self.training_ids, most, space.num_outputs
                )
            elif most:  # bounded whatever the labels' number
                self.fast_config["wide_buckets"] = paddle_models.wide_buckets(
                    most, space.num_outputs
                )
            self.model = paddle_models.build(self.fast_config)
            self.optimizer = paddle_models.optimizer(
                self.model, spec.hp.learning_rate, spec.hp.weight_decay
            )
        else:
            self.model = self._ernie(spec, space, vocab_size)
            self.optimizer = self._adamw(spec, self.model)
        pin_sources(self.model)
        self.amp = spec.hp.amp and spec.device_type != "cpu"
        self.amp_dtype = spec.hp.amp_dtype
        # float16's narrow range needs the loss scaled; bfloat16 has float32's range.
        use_scaler = self.amp and spec.hp.amp_dtype == "float16"
        self.scaler = paddle.amp.GradScaler() if use_scaler else None
        self.model.train()
        # Several processes (paddle.distributed.launch): gradients are averaged across them
        # (gloo on CPUs, the device's collective library otherwise).
        self.trained = self.model
        if self.world > 1:
            paddle.distributed.init_parallel_env()
            self.trained = paddle.DataParallel(self.model)

    @staticmethod
    def _adamw(spec: JobSpec, model):
        import paddle

        decay = [
            p.name for n, p in model.named_parameters() if not any(k in n for k in ("bias", "norm"))
        ]
        return paddle.optimizer.AdamW(
            learning_rate=spec.hp.learning_rate,
            parameters=model.parameters(),
            weight_decay=spec.hp.weight_decay,
            apply_decay_param_fun=lambda name: name in decay,
        )

    @staticmethod
    def _ernie(spec: JobSpec, space: LabelSpace, vocab_size: int):
        from paddlenlp.transformers import (
            ErnieConfig,
            ErnieForSequenceClassification,
            ErnieForTokenClassification,
        )

        cls = ErnieForTokenClassification if space.head == TOKEN else ErnieForSequenceClassification
        if spec.base_model_dir:
            refuse_pickles(Path(spec.base_model_dir))
            config = ErnieConfig.from_pretrained(spec.base_model_dir)
            config.num_labels = space.num_outputs
        else:
            assert spec.preset, "a spec without a base model names a preset"
            arch = {**preset_config(spec.preset), **spec.model_config}
            config = ErnieConfig(vocab_size=vocab_size, num_labels=space.num_outputs, **arch)
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = spec.hp.dropout
        if spec.base_model_dir:
            return cls.from_pretrained(spec.base_model_dir, config=config, use_safetensors=True)
        return cls(config)

    def _forward(self, batch: dict[str, np.ndarray], model=None):
        import paddle

        return (model or self.model)(
            input_ids=paddle.to_tensor(batch["input_ids"]),
            token_type_ids=paddle.to_tensor(batch["token_type_ids"]),
        )

    def _loss(self, logits, labels: np.ndarray, input_ids: np.ndarray):
        import paddle
        import paddle.nn.functional as F

        target = paddle.to_tensor(labels)

        def head_loss(out):
            if self.head == SINGLE:  # a float target is a teacher's distribution
                return F.cross_entropy(out, target, soft_label=target.dtype == paddle.float32)
            if self.head == MULTI:
                return F.binary_cross_entropy_with_logits(out, target)
            return F.cross_entropy(
                out.reshape([-1, out.shape[-1]]), target.reshape([-1]), ignore_index=IGNORE
            )

        if hasattr(self.model, "loss"):  # a fast model's own (a CRF's, a wide part's)
            return self.model.loss(logits, target, paddle.to_tensor(input_ids), head_loss)
        return head_loss(logits)

    def train_step(self, batch: dict[str, np.ndarray], lr: float) -> float:
        import paddle

        self.optimizer.set_lr(lr)
        with paddle.amp.auto_cast(enable=self.amp, dtype=self.amp_dtype):
            loss = self._loss(
                self._forward(batch, self.trained), batch["labels"], batch["input_ids"]
            )
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.minimize(self.optimizer, loss)
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.clear_grad()
        if self.world > 1:  # the loss of the whole batch: the mean of the processes' shares
            loss = loss.detach()
            paddle.distributed.all_reduce(loss)
            return float(loss) / self.world
        return float(loss)

    def logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        import paddle

        self.model.eval()
        with paddle.no_grad():
            out = self._forward(batch).numpy()
        self.model.train()
        return out

    def size_to(self, items: list) -> None:
        """Size what the training examples size before ``build``: a fast classifier's wide
        table (``paddle_models.sized_buckets``), recorded in its config.json."""
        self.training_ids = [e.enc.input_ids for e in items]

    def warm_start(self, items: list, resumed: bool = False) -> str:
        """A fast model's wide part solved on the training examples before the first step
        (a checkpoint, when resuming, brings it back; what it holds out is made again); what
        was done, or "" for none."""
        if not hasattr(self.model, "warm_start"):
            return ""
        return self.model.warm_start(
            [e.enc.input_ids for e in items], [e.target for e in items], self.head, resumed
        )

    def agree_max(self, value: float) -> float:
        """The largest ``value`` of the job's processes (a time budget's measurements)."""
        import paddle

        tensor = paddle.to_tensor([value], dtype="float64")
        paddle.distributed.all_reduce(tensor, op=paddle.distributed.ReduceOp.MAX)
        return float(tensor[0])

    def transitions(self) -> np.ndarray | None:
        """A CRF tagger's tag transitions, which decoding follows."""
        return self.model.transitions() if hasattr(self.model, "transitions") else None

    def save_model(self, directory: Path) -> None:
        if self.fast_config is not None:
            from runtime.backends import paddle_models

            paddle_models.save(self.model, self.fast_config, directory)
        else:
            super().save_model(directory)

    def load(self, directory: Path, with_optimizer: bool) -> None:
        if self.fast_config is not None:  # Paddle skips a weight of another shape, silently
            from runtime.backends import paddle_models

            saved = json.loads((directory / paddle_models.CONFIG).read_text("utf-8"))
            if saved != self.fast_config:
                differ = sorted(
                    k
                    for k in saved.keys() | self.fast_config
                    if saved.get(k) != self.fast_config.get(k)
                )
                raise ValueError(f"{directory} holds a model of another config ({differ})")
        super().load(directory, with_optimizer)


class PaddleBackend(LoopBackend):
    name = "paddle"
    runtime = "paddle_inference"
    generative_runtime = "paddle_generate"

    def model_ops(self) -> PaddleOps:
        return PaddleOps()

    def mlm_ops(self):
        from runtime.backends.paddle_mlm import PaddleMLMOps

        return PaddleMLMOps()

    def llm_ops(self) -> "PaddleLLMOps":
        from runtime.backends.paddle_llm import PaddleLLMOps

        return PaddleLLMOps()

    def export_classifier(self, spec: JobSpec, workdir: Path, out_dir: Path) -> dict[str, str]:
        import paddle
        from paddle.static import InputSpec
        from paddlenlp.transformers import (
            ErnieForSequenceClassification,
            ErnieForTokenClassification,
        )

        from runtime.backends import paddle_models

        paddle.set_device("cpu")  # export traces the graph; the runtime picks the device
        files = {"params_file": "inference.pdiparams"}
        if paddle_models.is_fast(workdir / BEST):
            model, _config = paddle_models.load(workdir / BEST)
            if hasattr(model, "transitions"):
                (out_dir / paddle_models.CRF_FILE).write_text(
                    json.dumps(model.transitions().tolist()), "utf-8"
                )
                files["crf_file"] = paddle_models.CRF_FILE
        else:
            kind = LabelSpace(spec.task_kind, tuple(spec.labels)).head
            cls = ErnieForTokenClassification if kind == TOKEN else ErnieForSequenceClassification
            model = cls.from_pretrained(str(workdir / BEST), use_safetensors=True)
        model.eval()
        static = paddle.jit.to_static(
            model,
            input_spec=[
                InputSpec([None, None], "int64", name="input_ids"),
                InputSpec([None, None], "int64", name="token_type_ids"),
            ][: 2 if getattr(model, "uses_token_types", lambda: True)() else 1],
            full_graph=True,
        )
        paddle.jit.save(static, str(out_dir / "inference"))
        shutil.copy(workdir / BEST / VOCAB, out_dir / VOCAB)
        model_file = next(
            p.name
            for p in out_dir.iterdir()
            if p.stem == "inference" and p.suffix in (".json", ".pdmodel")
        )  # PIR programs are inference.json, the legacy format inference.pdmodel
        return {"model_file": model_file, **files}
