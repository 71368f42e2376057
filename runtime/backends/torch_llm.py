"""Causal LMs on the torch backend: transformers' ``AutoModelForCausalLM`` (any Hugging Face
causal LM imported from disk) or the LLaMA preset, LoRA from ``peft``, and the shared SFT/DPO
loop of ``runtime.llm``. The export is the merged model in Hugging Face layout
(``model.safetensors`` + ``config.json``) with the tokenizer's files."""

import resource
from pathlib import Path

import numpy as np

from runtime.backends.torch import head_classes, load_torch_state, save_torch_state, torch_device
from runtime.chat import ChatTokenizer
from runtime.data import IGNORE
from runtime.generation import position_ids
from runtime.llm import backward_scaled, dpo_margin, lora_targets
from runtime.presets import LLM_PRESETS
from runtime.spec import JobSpec
from runtime.weights import refuse_pickles

TRAINED = "trained.safetensors"
ADAPTER = "adapter"


class TorchLLMOps:
    world, rank = 1, 0

    def build(self, spec: JobSpec, tokenizer: ChatTokenizer) -> None:
        import torch

        head_classes("single", auto=False)  # fails clearly where transformers lacks torch
        from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

        self.spec = spec
        hp = spec.hp
        self.device = torch_device(spec.device)
        torch.manual_seed(hp.seed)
        if spec.base_model_dir:
            refuse_pickles(Path(spec.base_model_dir))
            self.model = AutoModelForCausalLM.from_pretrained(
                spec.base_model_dir,
                torch_dtype=torch.float32,
                local_files_only=True,
                use_safetensors=True,
            )
        else:
            assert spec.preset, "a spec without a base model names a preset"
            arch = {
                k: v
                for k, v in {**LLM_PRESETS[spec.preset], **spec.model_config}.items()
                if k != "use_flash_attention"  # PaddleNLP's switch; transformers has its own
            }
            config = LlamaConfig(
                vocab_size=tokenizer.vocab_size,
                pad_token_id=tokenizer.pad_id,
                eos_token_id=tokenizer.stop_ids[0] if tokenizer.stop_ids else None,
                attn_implementation="eager",
                **arch,
            )
            self.model = LlamaForCausalLM(config)
        if hp.recompute:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False
        if hp.method == "lora":
            from peft import LoraConfig, get_peft_model

            config = LoraConfig(
                r=hp.lora_rank,
                lora_alpha=hp.lora_alpha,
                lora_dropout=hp.lora_dropout,
                target_modules=lora_targets(spec, self.model.config.model_type),
                task_type="CAUSAL_LM",
            )
            if hp.recompute:
                self.model.enable_input_require_grads()
            self.model = get_peft_model(self.model, config)
        self.model.to(self.device)
        self.trained = {n for n, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=hp.learning_rate,
            weight_decay=hp.weight_decay,
        )
        self.amp = hp.amp and spec.device_type != "cpu"
        self.dtype = torch.bfloat16 if hp.amp_dtype == "bfloat16" else torch.float16
        self.scaler = torch.amp.GradScaler() if self.amp and hp.amp_dtype == "float16" else None
        self.model.train()

    def _tensor(self, array: np.ndarray):
        import torch

        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _token_logps(self, batch: dict[str, np.ndarray]):
        import torch

        mask = batch["attention_mask"]
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.amp):
            logits = self.model(
                input_ids=self._tensor(batch["input_ids"]),
                attention_mask=self._tensor(mask),
                position_ids=self._tensor(position_ids(mask)),
            ).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        labels = self._tensor(batch["labels"][:, 1:])
        keep = labels != IGNORE
        picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * keep
        return picked.sum(-1), keep.float().sum(-1)

    def backward(self, batch: dict[str, np.ndarray], objective: str, scale: float) -> dict:
        import torch
        import torch.nn.functional as F

        sums, counts = self._token_logps(batch)
        figures = {}
        if objective == "sft":
            loss = -sums.sum() / counts.sum().clamp(min=1.0)
        else:
            ref = torch.from_numpy(batch["reference"]).float().to(self.device)
            margin = dpo_margin(sums, ref, self.spec.hp.dpo_beta)
            loss = -F.logsigmoid(margin).mean()
            figures["accuracy"] = float((margin > 0).float().mean())
        backward_scaled(loss, scale, self.scaler)
        return {"loss": float(loss), **figures}

    def update(self, lr: float) -> None:
        import torch

        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def token_logps(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        self.model.eval()
        with torch.no_grad():
            sums, counts = self._token_logps(batch)
        self.model.train()
        return np.stack([sums.cpu().numpy(), counts.cpu().numpy()], axis=1).astype("float64")

    def inference_lm(self):
        """The model in evaluation mode, as the generation engine runs it."""
        from runtime.generation import TorchLM

        return TorchLM(self.model, self.device)

    def save(self, directory: Path, with_optimizer: bool) -> None:
        from safetensors.torch import save_file

        # Tied weights (embeddings and the LM head) are one tensor: kept once, safetensors
        # refuses shared memory, and loading one sets both.
        state, seen = {}, set()
        for k, v in self.model.state_dict().items():
            if k in self.trained and v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                state[k] = v.detach().contiguous()
        save_file(state, str(directory / TRAINED), metadata={"format": "pt"})
        if with_optimizer:
            save_torch_state(directory, self.optimizer.state_dict())

    def load(self, directory: Path, with_optimizer: bool) -> None:
        from safetensors.torch import load_file

        state = load_file(str(directory / TRAINED), device=str(self.device))
        self.model.load_state_dict(state, strict=False)
        if with_optimizer:
            self.optimizer.load_state_dict(load_torch_state(directory, self.device))

    def export(self, directory: Path) -> dict:
        model = self.model
        files = {"model_file": "model.safetensors", "config_file": "config.json"}
        if self.spec.hp.method == "lora":
            # The adapter alone as well (peft's adapter_model.safetensors and
            # adapter_config.json), for engines that load LoRA adapters onto the base.
            model.save_pretrained(str(directory / ADAPTER))
            (directory / ADAPTER / "README.md").unlink(missing_ok=True)  # peft's model card
            files["adapter_dir"] = ADAPTER
            model = model.merge_and_unload()
        model.eval()
        model.save_pretrained(str(directory), safe_serialization=True)
        return files

    def peak_memory_mb(self) -> float | None:
        import torch

        if self.device.type == "cuda":
            return round(torch.cuda.max_memory_allocated() / 2**20, 1)
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
