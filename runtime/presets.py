"""Presets that ship with the install, built from a config with a character vocabulary made
from the training data: the fast models of CPU nodes (``FAST_PRESETS``, Paddle: a bag of
character n-grams for classification and pairs, a BiGRU-CRF for NER), small ERNIE-architecture
transformers (``PRESETS``) and causal LMs (``LLM_PRESETS``); which is the default for a task
kind and a device; and the recommended hyperparameters for each task kind, for presets and for
real imported base models (ERNIE 3.0 mini/medium/base, BERT or RoBERTa Chinese).
"""

from typing import Any

from runtime.kinds import GENERATIVE_KINDS
from runtime.spec import Hyperparameters

# name → the architecture's config (vocab_size comes from the data).
PRESETS: dict[str, dict] = {
    # 4 layers, hidden 312: the size of ERNIE 3.0 Tiny; trains a few thousand rows on a CPU in
    # minutes.
    "ernie-tiny-char": {
        "hidden_size": 312,
        "num_hidden_layers": 4,
        "num_attention_heads": 12,
        "intermediate_size": 1248,
        "max_position_embeddings": 512,
        "type_vocab_size": 4,
    },
    # 2 layers, hidden 128: seconds on a CPU; first runs, demos and the test suite.
    "ernie-micro-char": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 512,
        "type_vocab_size": 4,
    },
}
# The transformer preset an accelerator trains by default, and a CPU where the backend has no
# fast model.
DEFAULT_PRESET = "ernie-tiny-char"
CPU_TRANSFORMER = "ernie-micro-char"

# Fast models (runtime.backends.paddle_models) for nodes without an accelerator: on two cores
# they train 20 k rows in minutes and match TF-IDF + logistic regression (classification) or a
# character CRF (NER); "kinds" are the task kinds each trains.
FAST_PRESETS: dict[str, dict] = {
    "ngram-bag-char": {
        "architecture": "ngram_bag",
        "kinds": ["text_classification", "multi_label", "text_pair"],
        "embedding_size": 128,
        "buckets": 200_000,
        "ngrams": [2, 3],
        "conv_channels": 128,
        # The most: sized to the training rows' n-grams (paddle_models.sized_buckets).
        "wide_buckets": 4_194_304,
    },
    "bigru-crf-char": {
        "architecture": "bigru_crf",
        "kinds": ["ner"],
        "embedding_size": 128,
        "hidden_size": 128,
        "num_layers": 1,
        "buckets": 100_000,
        # 2^20 (4 MB a tag): at 2^18 the CRF's hashed features collide (5-fold, People's
        # Daily: entity F1 0.9074 against 0.9101, lower in every fold).
        "wide_buckets": 1_048_576,
    },
}
# The backends that train the fast presets.
FAST_BACKENDS = ("paddle",)

# Causal LMs for the generative kinds (instruction, preference): the LLaMA architecture, with a
# character vocabulary and the ChatML template (runtime.chat), trained with LoRA or in full.
LLM_PRESETS: dict[str, dict] = {
    # 2 layers, hidden 64: seconds on a CPU. A wide initialisation (0.2, not 0.02) lets LoRA
    # on its random weights learn, which the test suite and first runs rely on.
    "llama-tiny-char": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 172,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "initializer_range": 0.2,
        "use_flash_attention": False,
    },
}
DEFAULT_LLM_PRESET = "llama-tiny-char"


def presets_for(task_kind: str, backend: str = "paddle") -> dict[str, dict]:
    """The presets that train ``task_kind`` on ``backend``."""
    if task_kind in GENERATIVE_KINDS:
        return LLM_PRESETS
    fast = {
        name: config
        for name, config in FAST_PRESETS.items()
        if task_kind in config["kinds"] and backend in FAST_BACKENDS
    }
    return {**fast, **PRESETS}


def is_fast(preset: str | None) -> bool:
    return preset in FAST_PRESETS


def default_preset(
    task_kind: str, backend: str = "paddle", accelerated: bool = False, devices: int = 1
) -> str:
    """The preset a job of ``task_kind`` trains when it names none: a transformer on an
    accelerator, the kind's fast model on one CPU device (where the backend has one; its
    sparse n-gram tables train in one process)."""
    if task_kind in GENERATIVE_KINDS:
        return DEFAULT_LLM_PRESET
    if accelerated:
        return DEFAULT_PRESET
    if devices > 1:
        return CPU_TRANSFORMER
    fast = [n for n in presets_for(task_kind, backend) if n in FAST_PRESETS]
    return fast[0] if fast else CPU_TRANSFORMER


def preset_config(preset: str) -> dict:
    """The architecture's config of an encoder preset (without the kinds it trains)."""
    config = FAST_PRESETS.get(preset) or PRESETS[preset]
    return {k: v for k, v in config.items() if k != "kinds"}


# A model trained from scratch needs a larger learning rate than a pretrained one.
_FROM_SCRATCH = {"learning_rate": 1e-3, "epochs": 10, "batch_size": 16, "warmup_ratio": 0.1}
# The fast models: embeddings learn fast with a large rate (their wide parts ten times
# larger); early stopping ends them.
_FAST = {
    # 256 characters: a longer text is cut into windows, and a bag of n-grams over a window
    # is a weaker model of the text than over all of it (on real reviews, 18 % of which are
    # longer than 128: macro-F1 −0.4 % at 128).
    "ngram-bag-char": {
        "learning_rate": 3e-3,
        "epochs": 15,
        "batch_size": 32,
        "dropout": 0.3,
        "max_seq_length": 256,
    },
    "bigru-crf-char": {"learning_rate": 3e-3, "epochs": 15, "batch_size": 32, "dropout": 0.3},
}
_FINE_TUNE = {
    "text_classification": {"learning_rate": 5e-5, "epochs": 3, "batch_size": 32},
    "multi_label": {"learning_rate": 5e-5, "epochs": 5, "batch_size": 32},
    "ner": {"learning_rate": 5e-5, "epochs": 5, "batch_size": 16},
    "text_pair": {"learning_rate": 3e-5, "epochs": 3, "batch_size": 32},
}
# Per task kind, the size of base model the recommendations were written for:
# ERNIE 3.0 mini (6 layers, 384), medium (6, 768), base (12, 768); BERT/RoBERTa base (12, 768).
_MAX_LENGTH = {"text_classification": 128, "multi_label": 128, "ner": 128, "text_pair": 256}
# Causal LMs: LoRA on an imported chat model (Qwen2-0.5B…7B, LLaMA-2 Chinese, ERNIE), in the
# ranges of PaddleNLP's and TRL's recipes; the tiny preset learns from scratch, so faster.
_LLM = {
    "instruction": {"learning_rate": 2e-4, "epochs": 3, "batch_size": 4, "max_seq_length": 1024},
    "preference": {
        "learning_rate": 5e-5,
        "epochs": 1,
        "batch_size": 4,
        "max_seq_length": 1024,
    },
}
_LLM_PRESET = {
    "learning_rate": 1e-2,
    "epochs": 8,
    "batch_size": 8,
    "max_seq_length": 256,
    "warmup_ratio": 0.05,
    "weight_decay": 0.0,
}


def recommended(task_kind: str, *, preset: str | None) -> Hyperparameters:
    """The hyperparameters to start from: for a preset (from scratch) or an imported model."""
    if task_kind in _LLM:
        values: dict[str, Any] = {**_LLM[task_kind], **(_LLM_PRESET if preset else {})}
        return Hyperparameters(**values)
    if preset in FAST_PRESETS:
        values = {**_FAST[preset], "warmup_ratio": 0.02}
    else:
        values = dict(_FROM_SCRATCH) if preset else dict(_FINE_TUNE[task_kind])
    values.setdefault("max_seq_length", _MAX_LENGTH[task_kind])
    return Hyperparameters(**values)
