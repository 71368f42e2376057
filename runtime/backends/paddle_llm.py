"""Causal LMs on the paddle backend: PaddleNLP's ``AutoModelForCausalLM`` (LLaMA, Qwen2, the
ERNIE families it builds) or the LLaMA preset, LoRA from ``paddlenlp.peft``, and the shared
SFT/DPO loop of ``runtime.llm``. The export is the merged model in PaddleNLP's layout
(``model.safetensors`` + ``config.json``) with the tokenizer's files. Nothing here is a pickle:
weights, trained weights and the optimizer's state are safetensors."""

import resource
from pathlib import Path

import numpy as np

from runtime.backends.paddle import load_paddle_state, paddle_device, save_paddle_state
from runtime.chat import ChatTokenizer
from runtime.data import IGNORE
from runtime.generation import position_ids
from runtime.inference import flush_denormals
from runtime.llm import backward_scaled, dpo_margin, lora_targets
from runtime.presets import LLM_PRESETS
from runtime.spec import JobSpec
from runtime.weights import refuse_pickles

TRAINED = "trained.safetensors"
ADAPTER = "adapter"
# PaddleNLP's LoRA loader finds safetensors adapters through their index.
ADAPTER_WEIGHTS = "peft_model.safetensors"


def _logits(output):
    if isinstance(output, (tuple, list)):
        return output[0]
    return getattr(output, "logits", output)


class PaddleLLMOps:
    world, rank = 1, 0

    def build(self, spec: JobSpec, tokenizer: ChatTokenizer) -> None:
        import paddle
        from paddlenlp.transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
        from paddlenlp.utils.log import logger

        logger.set_level("WARNING")
        flush_denormals()
        self.spec = spec
        hp = spec.hp
        self.device = paddle_device(spec)
        paddle.set_device(self.device)
        paddle.seed(hp.seed)
        if spec.base_model_dir:
            refuse_pickles(Path(spec.base_model_dir))
            self.model = AutoModelForCausalLM.from_pretrained(
                spec.base_model_dir, dtype="float32", recompute=hp.recompute, use_safetensors=True
            )
        else:
            assert spec.preset, "a spec without a base model names a preset"
            arch = {**LLM_PRESETS[spec.preset], **spec.model_config}
            config = LlamaConfig(
                vocab_size=tokenizer.vocab_size,
                pad_token_id=tokenizer.pad_id,
                eos_token_id=tokenizer.stop_ids[0] if tokenizer.stop_ids else None,
                recompute=hp.recompute,
                **arch,
            )
            self.model = LlamaForCausalLM(config)
        model_type = getattr(self.model.config, "model_type", "llama")
        if hp.method == "lora":
            from paddlenlp.peft import LoRAConfig, LoRAModel

            config = LoRAConfig(
                # PaddleNLP matches target modules as regular expressions of full names.
                target_modules=[f".*{name}" for name in lora_targets(spec, model_type)],
                r=hp.lora_rank,
                lora_alpha=hp.lora_alpha,
                lora_dropout=hp.lora_dropout,
                merge_weights=False,
            )
            self.model = LoRAModel(self.model, config)
            self.model.mark_only_lora_as_trainable()
        self.trained = {name for name, p in self.model.named_parameters() if not p.stop_gradient}
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=hp.learning_rate,
            parameters=[p for p in self.model.parameters() if not p.stop_gradient],
            weight_decay=hp.weight_decay,
            grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
        )
        self.amp = hp.amp and spec.device_type != "cpu"
        self.scaler = paddle.amp.GradScaler() if self.amp and hp.amp_dtype == "float16" else None
        self.model.train()

    def _token_logps(self, batch: dict[str, np.ndarray]):
        """Per sequence: the summed log p of its labelled tokens, and how many there are."""
        import paddle
        import paddle.nn.functional as F

        mask = batch["attention_mask"]
        with paddle.amp.auto_cast(enable=self.amp, dtype=self.spec.hp.amp_dtype):
            logits = _logits(
                self.model(
                    input_ids=paddle.to_tensor(batch["input_ids"]),
                    attention_mask=paddle.to_tensor(mask),
                    position_ids=paddle.to_tensor(position_ids(mask)),
                )
            )
        logp = F.log_softmax(logits[:, :-1].astype("float32"), axis=-1)
        labels = paddle.to_tensor(batch["labels"][:, 1:])
        keep = labels != IGNORE
        safe = paddle.where(keep, labels, paddle.zeros_like(labels))
        picked = paddle.take_along_axis(logp, safe.unsqueeze(-1), axis=-1).squeeze(-1)
        picked = picked * keep.astype("float32")
        return picked.sum(axis=-1), keep.astype("float32").sum(axis=-1)

    def backward(self, batch: dict[str, np.ndarray], objective: str, scale: float) -> dict:
        import paddle
        import paddle.nn.functional as F

        sums, counts = self._token_logps(batch)
        figures = {}
        if objective == "sft":
            loss = -sums.sum() / paddle.clip(counts.sum(), min=1.0)
        else:
            ref = paddle.to_tensor(batch["reference"].astype("float32"))
            margin = dpo_margin(sums, ref, self.spec.hp.dpo_beta)
            loss = -F.log_sigmoid(margin).mean()
            figures["accuracy"] = float((margin > 0).astype("float32").mean())
        backward_scaled(loss, scale, self.scaler)
        return {"loss": float(loss), **figures}

    def update(self, lr: float) -> None:
        self.optimizer.set_lr(lr)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.clear_grad()

    def token_logps(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        import paddle

        self.model.eval()
        with paddle.no_grad():
            sums, counts = self._token_logps(batch)
        self.model.train()
        return np.stack([sums.numpy(), counts.numpy()], axis=1).astype("float64")

    def inference_lm(self):
        """The model in evaluation mode, as the generation engine runs it."""
        from runtime.generation import PaddleLM

        return PaddleLM(self.model)

    def save(self, directory: Path, with_optimizer: bool) -> None:
        from safetensors.numpy import save_file

        state = {
            k: v.numpy() for k, v in self.model.state_dict().items() if k in self._state_keys()
        }
        save_file(state, str(directory / TRAINED), metadata={"format": "np"})
        if with_optimizer:
            save_paddle_state(directory, self.optimizer.state_dict())

    def _state_keys(self) -> set[str]:
        # state_dict's names of the trained parameters (LoRA: the adapters only).
        return self.trained

    def load(self, directory: Path, with_optimizer: bool) -> None:
        from safetensors.numpy import load_file

        self.model.set_state_dict(load_file(str(directory / TRAINED)))
        if with_optimizer:
            self.optimizer.set_state_dict(load_paddle_state(directory))

    def export(self, directory: Path) -> dict:
        model = self.model
        files = {"model_file": "model.safetensors", "config_file": "config.json"}
        if self.spec.hp.method == "lora":
            # The adapter alone as well (peft_model.safetensors and its index,
            # lora_config.json), for whoever applies it to the base model elsewhere.
            self._save_adapter(directory / ADAPTER)
            files["adapter_dir"] = ADAPTER
            model.merge()
            model = model.restore_original_model()
        model.eval()
        model.save_pretrained(str(directory), safe_serialization=True)
        return files

    def _save_adapter(self, directory: Path) -> None:
        """PaddleNLP's LoRAModel.save_pretrained pickles (paddle.save); the same files as
        safetensors, which its LoRAModel.from_pretrained reads through the index."""
        from safetensors.numpy import save_file

        from runtime.weights import write_index

        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.numpy() for k, v in self.model.get_trainable_state_dict().items()}
        save_file(state, str(directory / ADAPTER_WEIGHTS), metadata={"format": "np"})
        write_index(directory / ADAPTER_WEIGHTS, state)
        self.model.lora_config.save_pretrained(str(directory))
        self.model.model.config.save_pretrained(str(directory))

    def peak_memory_mb(self) -> float | None:
        import paddle

        if self.device.startswith("gpu") and paddle.is_compiled_with_cuda():
            return round(paddle.device.cuda.max_memory_allocated() / 2**20, 1)
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
