"""The paddle backend's ops for masked language modelling (``runtime.mlm``): PaddleNLP's
``ErnieForMaskedLM``, from an imported ERNIE (or an earlier pretraining's result) or from a
transformer preset's config. Saved with ``save_pretrained`` as safetensors: the encoder's
weights keep the ``ernie.`` names the classification heads load, the MLM head (``cls.``) is
left aside when they do."""

from pathlib import Path

import numpy as np

from runtime.backends.paddle import PaddleCheckpointed, PaddleOps, paddle_device
from runtime.data import IGNORE
from runtime.inference import flush_denormals
from runtime.presets import PRESETS, preset_config
from runtime.spec import JobSpec
from runtime.weights import refuse_pickles


class PaddleMLMOps(PaddleCheckpointed):
    def build(self, spec: JobSpec, vocab_size: int) -> None:
        import paddle
        from paddlenlp.transformers import ErnieConfig, ErnieForMaskedLM
        from paddlenlp.utils.log import logger

        logger.set_level("WARNING")
        flush_denormals()
        paddle.set_device(paddle_device(spec))
        paddle.seed(spec.hp.seed)
        if spec.base_model_dir:
            refuse_pickles(Path(spec.base_model_dir))
            config = ErnieConfig.from_pretrained(spec.base_model_dir)
        else:
            if spec.preset not in PRESETS:
                raise ValueError(
                    f"masked language modelling trains a transformer preset "
                    f"({', '.join(PRESETS)}) or an imported ERNIE, not {spec.preset!r}"
                )
            arch = {**preset_config(spec.preset), **spec.model_config}
            config = ErnieConfig(vocab_size=vocab_size, **arch)
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = spec.hp.dropout
        if spec.base_model_dir:
            self.model = ErnieForMaskedLM.from_pretrained(
                spec.base_model_dir, config=config, use_safetensors=True
            )
        else:
            self.model = ErnieForMaskedLM(config)
        self.optimizer = PaddleOps._adamw(spec, self.model)
        self.amp = spec.hp.amp and spec.device_type != "cpu"
        self.amp_dtype = spec.hp.amp_dtype
        use_scaler = self.amp and spec.hp.amp_dtype == "float16"
        self.scaler = paddle.amp.GradScaler() if use_scaler else None
        self.model.train()

    def _loss(self, batch: dict[str, np.ndarray]):
        import paddle
        import paddle.nn.functional as F

        logits = self.model(
            input_ids=paddle.to_tensor(batch["input_ids"]),
            token_type_ids=paddle.to_tensor(batch["token_type_ids"]),
        )
        if isinstance(logits, tuple | list):
            logits = logits[0]
        labels = paddle.to_tensor(batch["labels"]).reshape([-1])
        flat = logits.reshape([-1, logits.shape[-1]]).astype("float32")
        return flat, labels, F.cross_entropy(flat, labels, ignore_index=IGNORE)

    def train_step(self, batch: dict[str, np.ndarray], lr: float) -> float:
        import paddle

        self.optimizer.set_lr(lr)
        with paddle.amp.auto_cast(enable=self.amp, dtype=self.amp_dtype):
            _flat, _labels, loss = self._loss(batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.minimize(self.optimizer, loss)
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.clear_grad()
        return float(loss)

    def evaluate(self, batch: dict[str, np.ndarray]) -> tuple[float, int, int]:
        import paddle
        import paddle.nn.functional as F

        self.model.eval()
        with paddle.no_grad():
            flat, labels, _loss = self._loss(batch)
            keep = labels != IGNORE
            picked, gold = flat[keep], labels[keep]
            n = int(gold.shape[0])
            total = float(F.cross_entropy(picked, gold, reduction="sum")) if n else 0.0
            correct = int((picked.argmax(axis=-1) == gold).astype("int64").sum()) if n else 0
        self.model.train()
        return total, n, correct
