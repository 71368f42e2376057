"""Models on disk: base models made in the runtime venv (Paddle, torch, transformers) under
the server's import directory, and model versions with files in storage as a job leaves
them."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from tests.helpers.data import FILLER, NEG, POS

# The characters of the reviews the tests train on: the vocabulary of the models made here.
CHARS = FILLER + "".join(POS + NEG) + "北京上海广州深圳物流快0123456789"
_MAKE_ENCODER = """
import json, pathlib, sys
from {package} import {name}Config, {name}Model
from runtime.tokenizer import CharTokenizer
d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True)
tok = CharTokenizer.build([sys.argv[2]])
tok.save(d / "vocab.txt")
{name}Model({name}Config(vocab_size=len(tok.vocab), hidden_size=64, num_hidden_layers=2,
           num_attention_heads=2, intermediate_size=128)).save_pretrained(str(d))
"""
# An ERNIE in PaddleNLP layout, and a BERT in Hugging Face layout (argv: directory, chars).
MAKE_PADDLE = _MAKE_ENCODER.format(package="paddlenlp.transformers", name="Ernie") + (
    '(d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ErnieTokenizer"}))\n'
)
MAKE_HF = _MAKE_ENCODER.format(package="transformers", name="Bert")
# A tiny LLaMA of either backend (argv: directory, backend, and "safetensors" for PaddleNLP's
# weights as safetensors rather than its pickle, as the platform's import leaves them).
MAKE_LLM = """
import pathlib, sys
from runtime.chat import build_char_tokenizer
d = pathlib.Path(sys.argv[1]); backend = sys.argv[2]; safe = sys.argv[3:] == ["safetensors"]
chars = "0123456789加等于几？。我不知道userassistantsystem"
tok = build_char_tokenizer([chars], d)
arch = dict(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=172, max_position_embeddings=512,
            tie_word_embeddings=False, initializer_range=0.2, pad_token_id=0)
if backend == "paddle":  # seeded: the same weights in every session, so the same answers
    import paddle
    paddle.seed(0)
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(use_flash_attention=False, **arch))
    model.save_pretrained(str(d), safe_serialization=safe)
else:
    import torch
    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(**arch)).save_pretrained(str(d))
"""


def in_runtime(
    script: str, *args: str, env: dict | None = None, stdin: str = "", timeout: float = 180
) -> str:
    """Run ``script`` with the runtime venv's Python (Paddle, torch, transformers), the project
    on its path and only ``env`` besides; its output."""
    from django.conf import settings

    proc = subprocess.run(
        [str(settings.TRAINING_PYTHON), "-c", script, *args],
        input=stdin,
        cwd=settings.BASE_DIR,
        env={"PATH": "/usr/bin:/bin", **(env or {}), "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def model_dir(script: str, name: str, *args: str, env: dict | None = None) -> Path:
    """The directory ``name`` under the server's import directory, made by ``script`` (argv:
    the directory, ``args``) unless an earlier session made it."""
    from django.conf import settings

    target = settings.MODEL_IMPORT_DIR / name
    if not target.exists():
        in_runtime(script, str(target), *args, env=env)
    return target


def chat_model_dir(arch: str, backend: str) -> Path:
    """A tiny chat model of ``arch`` (Qwen2, ERNIE 4.5, GLM-4…) in ``backend``'s layout, with
    its chat models' tokenizer files and template (tests/runtime/test_architectures.py), under
    the server's import directory as ``tiny-<arch>-<backend>``."""
    import json

    from django.conf import settings

    from tests.runtime.test_architectures import CHAT, CLASSES, CONVERSATIONS, MAKE

    target = settings.MODEL_IMPORT_DIR / f"tiny-{arch}-{backend}"
    if not target.exists():
        in_runtime(
            MAKE,
            CLASSES[arch],
            backend,
            str(target),
            json.dumps(CHAT[arch], ensure_ascii=False),
            json.dumps(CONVERSATIONS, ensure_ascii=False),
            env={"USE_TORCH": "0"} if backend == "paddle" else None,
        )
    return target


def stored_model(team, owner, tmp_path: Path, **fields):
    """A model version with real files in storage (a made-up export), as a job leaves one."""
    from runtime.inference import write_manifest
    from training import storage
    from training.models import ModelVersion

    export = tmp_path / "staged" / "export"
    export.mkdir(parents=True)
    (export / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n好\n", encoding="utf-8")
    (export / "model.onnx").write_bytes(b"\x08\x01 not really onnx")
    manifest = write_manifest(
        export,
        task_kind="text_classification",
        labels=["正面", "负面"],
        head="single",
        max_length=32,
        backend="torch",
        runtime="onnxruntime",
        model_file="model.onnx",
    )
    prefix = f"models/{uuid.uuid4().hex}/"
    files = storage.store_dir(tmp_path / "staged", prefix)
    values = dict(
        team=team,
        name="reviews",
        number=1,
        task_kind="text_classification",
        labels=["正面", "负面"],
        backend="torch",
        runtime="onnxruntime",
        manifest=manifest,
        metrics={"accuracy": 0.9},
        storage_prefix=prefix,
        files=files,
        created_by=owner,
    )
    return ModelVersion.objects.create(**{**values, **fields})
