"""Every write of the training app: base-model import, job submission, cancel, retry, clone,
the run of a job on a train worker (supervising the runner process), and the model registry."""

import ctypes
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.files.storage import default_storage
from django.db import DatabaseError, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.translation import gettext as _
from jinja2 import TemplateError

from console.hardware import placement_plan, profile
from console.models import Membership, Node, Team
from console.quotas import team_storage_check
from console.roles import Role
from console.selectors import live_nodes_with
from console.services import (
    DevicesBusy,
    audit_record,
    devices_acquire,
    devices_release,
    devices_release_all_but,
)
from labeling.models import DatasetVersion
from runtime import sandbox, weights
from runtime.backends import available as available_backends
from runtime.data import HEADS, OBJECTIVES
from runtime.estimate import causal_lm_summary
from runtime.inference import MANIFEST, PATH_FIELDS, read_manifest, write_manifest
from runtime.presets import LLM_PRESETS, PRESETS, default_preset, presets_for, recommended
from runtime.run import EVENT_PREFIX
from runtime.spec import Hyperparameters, JobSpec
from runtime.tokenizer import CharTokenizer
from training import storage
from training.models import BaseModel, ModelVersion, TrainingEvent, TrainingJob

# -- Base models -----------------------------------------------------------------------------

MODEL_EXPORT = "export/"  # where a model version's export lies under its storage prefix

# What each backend needs of an imported model: alternatives in a tuple.
REQUIRED_FILES = {
    "paddle": (
        ("config.json",),
        ("model_state.pdparams", "model.safetensors"),
        ("vocab.txt",),
        ("tokenizer_config.json",),
    ),
    "torch": (("config.json",), ("model.safetensors", "pytorch_model.bin"), ("vocab.txt",)),
}
# The architectures each backend builds (config.json's model_type).
ARCHITECTURES = {"paddle": ("ernie",), "torch": ("bert", "ernie", "roberta")}
# Causal LMs for instruction and preference data: what PaddleNLP 3.0.0b4's and transformers
# 4.55's AutoModelForCausalLM build without remote code. The LLaMA architecture is tested here
# (the tiny preset); the others are declared from the libraries.
CAUSAL_ARCHITECTURES = {
    "paddle": (
        "llama",
        "qwen",
        "qwen2",
        "qwen2_moe",
        "mistral",
        "mixtral",
        "chatglm_v2",
        "bloom",
        "gemma",
        "deepseek_v2",
        "deepseek_v3",
        "yuan",
    ),
    "torch": (
        "llama",
        "qwen2",
        "qwen3",
        "qwen2_moe",
        "qwen3_moe",
        "mistral",
        "mixtral",
        "gemma",
        "gemma2",
        "ernie4_5",
        "deepseek_v3",
        "phi3",
    ),
}
CAUSAL_WEIGHTS = {
    "paddle": (
        "model_state.pdparams",
        "model.safetensors",
        "model_state.pdparams.index.json",
        "model.safetensors.index.json",
    ),
    "torch": (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ),
}


def _model_type(config: dict) -> str:
    if config.get("model_type"):
        return str(config["model_type"]).lower()
    for arch in config.get("architectures") or []:
        for known in ("ernie", "bert", "roberta"):
            if str(arch).lower().startswith(known):
                return known
    return ""


def inspect_model_dir(directory: Path, backend: str) -> dict:
    """Check a base model's files for ``backend``; what was found, or a ValidationError that
    names the missing or wrong file."""
    if backend not in REQUIRED_FILES:
        raise ValidationError(_("Unknown backend “%(b)s”.") % {"b": backend})
    config = _read_config(directory)
    if _is_causal_lm(config):
        return _inspect_causal_lm(directory, backend, config)
    for names in REQUIRED_FILES[backend]:
        if not any((directory / n).is_file() for n in names):
            raise ValidationError(
                _("The model lacks %(file)s (needed by the %(backend)s backend).")
                % {"file": _(" or ").join(names), "backend": backend}
            )
    arch = _model_type(config)
    if arch not in ARCHITECTURES[backend]:
        raise ValidationError(
            _(
                "config.json describes the architecture “%(arch)s”; the %(backend)s backend "
                "builds %(known)s."
            )
            % {"arch": arch or "?", "backend": backend, "known": ", ".join(ARCHITECTURES[backend])}
        )
    try:
        vocab = CharTokenizer.from_file(directory / "vocab.txt").vocab
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(_("vocab.txt: %(e)s") % {"e": exc}) from exc
    weights = next(directory / n for n in REQUIRED_FILES[backend][1] if (directory / n).is_file())
    return {
        "architecture": arch,
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "heads": config.get("num_attention_heads"),
        "vocab_size": config.get("vocab_size") or len(vocab),
        "vocab_entries": len(vocab),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "weights_file": weights.name,
        # float32 weights: 4 bytes a parameter.
        "parameters_approx": weights.stat().st_size // 4,
    }


def _read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise ValidationError(_("The model lacks %(file)s.") % {"file": "config.json"})
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(_("config.json is not valid JSON: %(e)s") % {"e": exc}) from exc
    if not isinstance(config, dict):
        raise ValidationError(_("config.json is not a JSON object."))
    return config


def _is_causal_lm(config: dict) -> bool:
    names = [str(a) for a in config.get("architectures") or []]
    known = {a for archs in CAUSAL_ARCHITECTURES.values() for a in archs}
    return any(n.endswith("ForCausalLM") for n in names) or _model_type(config) in known


def _inspect_causal_lm(directory: Path, backend: str, config: dict) -> dict:
    """A causal LM's files: config, weights, tokenizer.json and a chat template of its own."""
    arch = _model_type(config)
    if arch not in CAUSAL_ARCHITECTURES[backend]:
        raise ValidationError(
            _(
                "config.json describes the causal LM architecture “%(arch)s”; the %(backend)s "
                "backend builds %(known)s."
            )
            % {
                "arch": arch or "?",
                "backend": backend,
                "known": ", ".join(CAUSAL_ARCHITECTURES[backend]),
            }
        )
    weights = [n for n in CAUSAL_WEIGHTS[backend] if (directory / n).is_file()]
    if not weights:
        raise ValidationError(
            _("The model lacks %(file)s (needed by the %(backend)s backend).")
            % {"file": _(" or ").join(CAUSAL_WEIGHTS[backend]), "backend": backend}
        )
    if not (directory / "tokenizer.json").is_file():
        raise ValidationError(
            _(
                "The model lacks tokenizer.json: convert its tokenizer to the fast format "
                "(transformers' AutoTokenizer.save_pretrained) before importing it."
            )
        )
    tokenizer_config = {}
    if (directory / "tokenizer_config.json").is_file():
        try:
            tokenizer_config = json.loads(
                (directory / "tokenizer_config.json").read_text(encoding="utf-8")
            )
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValidationError(
                _("tokenizer_config.json is not valid JSON: %(e)s") % {"e": exc}
            ) from exc
    has_template = (
        (directory / "chat_template.jinja").is_file()
        or (directory / "chat_template.json").is_file()
        or bool(tokenizer_config.get("chat_template"))
    )
    if not has_template:
        raise ValidationError(
            _(
                "The model has no chat template (chat_template.jinja, chat_template.json or "
                "chat_template in tokenizer_config.json); none is assumed."
            )
        )
    from runtime.chat import ChatTemplateError, check_template

    try:
        check_template(directory)  # a template that loops for ever is refused here
    except (ChatTemplateError, TemplateError) as exc:
        raise ValidationError(
            _("The model's chat template cannot be used: %(e)s") % {"e": exc}
        ) from exc
    summary = causal_lm_summary(config)
    return {**summary, "architecture": arch, "weights_file": weights[0]}


def _dir_size(directory: Path) -> int:
    """The bytes of the files under ``directory``: what storing it takes of a team's quota."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def weights_to_safetensors(directory: Path) -> dict[str, str]:
    """Pickled weights under ``directory`` replaced by safetensors, read by a restricted
    unpickler that runs nothing (runtime/weights.py); other pickles (optimizer states,
    Trainer arguments) are left out. Returns {pickle: its safetensors, or "" if left out}."""
    try:
        return weights.convert_dir(directory, settings.ARCHIVE_MAX_UNCOMPRESSED_BYTES)
    except weights.UnsafeWeights as exc:
        raise ValidationError(_("The weights were refused: %(error)s") % {"error": exc}) from exc


def _import_root_path(path: str) -> Path:
    root = settings.MODEL_IMPORT_DIR.resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ValidationError(
            _("Models are imported from %(root)s on the server; %(path)s is outside it.")
            % {"root": root, "path": path}
        )
    if not target.exists():
        raise ValidationError(_("%(path)s does not exist on the server.") % {"path": target})
    return target


def _refuse_links(directory: Path) -> None:
    """A directory to import holds no symbolic links: copying follows them, so a link to the
    platform's secrets or another team's model would be copied into the team's model."""
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            raise ValidationError(
                _("%(path)s is a symbolic link; a model directory to import may not hold links.")
                % {"path": path.relative_to(directory)}
            )


def base_model_import(
    *,
    actor: AbstractBaseUser,
    team: Team,
    name: str,
    backend: str = "paddle",
    path: str = "",
    archive=None,
    shared: bool = False,
) -> BaseModel:
    """Import a base model from a directory or archive under MODEL_IMPORT_DIR (``path``) or an
    uploaded archive (``archive``, an UploadedFile). Nothing is downloaded."""
    name = name.strip()
    if not name:
        raise ValidationError(_("A base model needs a name."))
    if shared:
        _check_may_share(actor)
    owner = None if shared else team
    if BaseModel.objects.filter(team=owner, name=name).exists():
        raise ValidationError(_("A base model named “%(name)s” exists already.") % {"name": name})
    if bool(path) == (archive is not None):
        raise ValidationError(_("Give either a path on the server or an archive to upload."))
    with tempfile.TemporaryDirectory(prefix="base-model-") as tmp:
        tmp_path = Path(tmp)
        if archive is not None:
            source = Path(archive.name or "upload").name
            local = tmp_path / "upload.archive"  # never a path from the client's file name
            with open(local, "wb") as f:
                for chunk in archive.chunks():
                    f.write(chunk)
            directory = storage.extract_archive(local, tmp_path / "x")
        else:
            target = _import_root_path(path)
            source = str(target)
            if target.is_dir():  # a copy: its weights are converted, the server's left alone
                directory = tmp_path / "x"
                _refuse_links(target)
                shutil.copytree(target, directory, symlinks=True)
            else:
                directory = storage.extract_archive(target, tmp_path / "x")
        converted = weights_to_safetensors(directory)
        summary = inspect_model_dir(directory, backend)
        if converted:
            summary["converted"] = converted
        if owner is not None:
            team_storage_check(team, _dir_size(directory))
        prefix = f"base_models/{uuid.uuid4().hex}/"
        files = storage.store_dir(directory, prefix)
    # Stored first, then the row in a short transaction (not the write lock for the copy).
    with transaction.atomic():
        model = BaseModel.objects.create(
            team=owner,
            name=name,
            backend=backend,
            architecture=summary["architecture"],
            summary=summary,
            manifest={"files": files},
            storage_prefix=prefix,
            source=source,
            created_by=actor,
        )
        audit_record(
            action="base_model.import",
            actor=actor,
            team=team,
            target=model,
            data={"source": source, "backend": backend, "shared": shared, "files": len(files)},
        )
    return model


def base_model_from_version(
    *, actor: AbstractBaseUser, version: ModelVersion, name: str
) -> BaseModel:
    """A fine-tuned large model as the base of further jobs (SFT, then DPO on its answers):
    its export, a complete causal LM with tokenizer and template, copied as a base model of
    the team. Classifiers' exports are inference graphs, not checkpoints to train on."""
    name = name.strip()
    if not name:
        raise ValidationError(_("A base model needs a name."))
    if version.task_kind not in OBJECTIVES:
        raise ValidationError(
            _("Only large models (instruction, preference) continue training as a base model.")
        )
    if BaseModel.objects.filter(team=version.team, name=name).exists():
        raise ValidationError(_("A base model named “%(name)s” exists already.") % {"name": name})
    files = {
        rel.removeprefix(MODEL_EXPORT): meta
        for rel, meta in version.files.items()
        if rel.startswith(MODEL_EXPORT)
        and rel != MODEL_EXPORT + MANIFEST
        and not rel.startswith(MODEL_EXPORT + "adapter/")  # the merged weights hold it
    }
    with tempfile.TemporaryDirectory(prefix="base-model-") as tmp:
        directory = Path(tmp)
        storage.fetch_dir(version.storage_prefix + MODEL_EXPORT, files, directory)
        weights_to_safetensors(directory)  # versions exported before weights were safetensors
        summary = inspect_model_dir(directory, version.backend)
        team_storage_check(version.team, _dir_size(directory))
        prefix = f"base_models/{uuid.uuid4().hex}/"
        stored = storage.store_dir(directory, prefix)
    with transaction.atomic():  # short: the files are stored already
        model = BaseModel.objects.create(
            team=version.team,
            name=name,
            backend=version.backend,
            architecture=summary["architecture"],
            summary=summary,
            manifest={"files": stored},
            storage_prefix=prefix,
            source=f"{version.name} v{version.number}",
            created_by=actor,
        )
        audit_record(
            action="base_model.from_version",
            actor=actor,
            team=version.team,
            target=model,
            data={"model_version": f"{version.name} v{version.number}"},
        )
    return model


def _check_may_share(actor: AbstractBaseUser) -> None:
    """A model shared with every team of the site is used by teams whose members did not
    choose it: only site staff publish one (or take one back)."""
    if not actor.is_staff:
        raise PermissionDenied(
            _(
                "Only site staff may share a base model with every team of the site; import it "
                "for this team instead."
            )
        )


@transaction.atomic
def base_model_set_shared(
    *, actor: AbstractBaseUser, team: Team, model: BaseModel, shared: bool
) -> BaseModel:
    """Site staff publish a team's base model to every team of the site (``shared``), or take a
    shared one back into ``team``."""
    _check_may_share(actor)
    model = BaseModel.objects.select_for_update().get(pk=model.pk)
    owner = None if shared else team
    if (model.team_id is None) == shared:
        return model
    if BaseModel.objects.filter(team=owner, name=model.name).exclude(pk=model.pk).exists():
        raise ValidationError(
            _("A base model named “%(name)s” exists already.") % {"name": model.name}
        )
    model.team = owner
    model.save(update_fields=["team"])
    audit_record(
        action="base_model.share" if shared else "base_model.unshare",
        actor=actor,
        team=team,
        target=model,
        data={"shared": shared},
    )
    return model


def base_model_named(team: Team, name: str, backend: str) -> BaseModel:
    """The team's own base model of this name for ``backend``, else the site's shared one of that
    name (the team's always wins, on every database: two queries, not an order of NULLs); an
    error that lists what is imported otherwise."""
    from training.selectors import team_base_models

    candidates = team_base_models(team).filter(backend=backend)
    found = (
        candidates.filter(name=name, team=team).first()
        or candidates.filter(name=name, team__isnull=True).first()
    )
    if found is None:
        names = ", ".join(candidates.values_list("name", flat=True)) or _("none")
        raise ValidationError(
            _(
                "No base model named “%(name)s” is imported for the %(backend)s backend. "
                "Imported: %(names)s. Presets: %(presets)s."
            )
            % {
                "name": name,
                "backend": backend,
                "names": names,
                "presets": ", ".join([*PRESETS, *LLM_PRESETS]),
            }
        )
    return found


# -- Jobs ------------------------------------------------------------------------------------


def _job_labels(version: DatasetVersion) -> list[str]:
    """The dataset's declared labels in their order, else those found in the version."""
    return list(version.dataset.labels) or sorted(version.stats.get("labels", {}))


def _validated_hyperparameters(task_kind: str, preset: str | None, given: dict) -> Hyperparameters:
    values = {**asdict(recommended(task_kind, preset=preset)), **(given or {})}
    try:
        hp = Hyperparameters.from_dict(values)
        for name, kind in Hyperparameters.__annotations__.items():
            value = getattr(hp, name)
            if kind == list[str]:
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{name} must be a list of names")
                continue
            if kind is bool and not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false")
            try:
                number = value if kind in (bool, str) else float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a number, not {value!r}") from None
            if kind is int and (isinstance(value, bool) or number != int(number)):
                raise ValueError(f"{name} must be a whole number, not {value!r}")
            setattr(hp, name, int(number) if kind is int else kind(number))
    except (TypeError, ValueError) as exc:
        raise ValidationError(_("Hyperparameters: %(e)s") % {"e": exc}) from exc
    checks = [
        (hp.epochs >= 1, "epochs ≥ 1"),
        (1 <= hp.batch_size <= 4096, "1 ≤ batch_size ≤ 4096"),
        (0 < hp.learning_rate < 1, "0 < learning_rate < 1"),
        (
            8 <= hp.max_seq_length <= (32768 if task_kind in OBJECTIVES else 512),
            "8 ≤ max_seq_length ≤ 512 (32768 for instruction and preference data)",
        ),
        (0 <= hp.warmup_ratio < 1, "0 ≤ warmup_ratio < 1"),
        (0 <= hp.weight_decay < 1, "0 ≤ weight_decay < 1"),
        (hp.early_stopping_patience >= 0, "early_stopping_patience ≥ 0"),
        (0 < hp.threshold < 1, "0 < threshold < 1"),
        (0 <= hp.dropout < 1, "0 ≤ dropout < 1"),
        (hp.checkpoint_steps >= 0, "checkpoint_steps ≥ 0"),
        (
            hp.metric in ("accuracy", "macro_f1", "micro_f1", "weighted_f1"),
            "metric is accuracy, macro_f1, micro_f1 or weighted_f1",
        ),
        (hp.amp_dtype in ("bfloat16", "float16"), "amp_dtype is bfloat16 or float16"),
        (hp.method in ("lora", "full"), "method is lora or full"),
        (1 <= hp.lora_rank <= 1024, "1 ≤ lora_rank ≤ 1024"),
        (hp.lora_alpha > 0, "lora_alpha > 0"),
        (0 <= hp.lora_dropout < 1, "0 ≤ lora_dropout < 1"),
        (1 <= hp.gradient_accumulation_steps <= 1024, "1 ≤ gradient_accumulation_steps ≤ 1024"),
        (hp.dpo_beta > 0, "dpo_beta > 0"),
        (1 <= hp.max_new_tokens <= 4096, "1 ≤ max_new_tokens ≤ 4096"),
        (0 <= hp.eval_generations <= 200, "0 ≤ eval_generations ≤ 200"),
        (0 <= hp.min_rating <= 5, "0 ≤ min_rating ≤ 5"),
    ]
    for ok, rule in checks:
        if not ok:
            raise ValidationError(_("Hyperparameters: %(rule)s.") % {"rule": rule})
    return hp


# Rows over the token limit listed in a job's data report (all are counted).
TOKEN_REPORT_ROWS = 200


def token_report(
    version: DatasetVersion, model: BaseModel | None, task_kind: str, limit: int
) -> dict:
    """Each answered row of an instruction or preference version counted in tokens, as the
    runner will count it (the base model's tokenizer and chat template, or the preset's
    characters and ChatML): how many there are per split, and the rows over ``limit`` (by
    their number in the version), which the job leaves out."""
    from runtime.chat import TOKENIZER_FILES, ChatTokenizer, build_char_tokenizer, encode_row
    from runtime.data import is_labeled

    with default_storage.open(version.data_file, "rb") as f:
        rows = [(n, json.loads(line)) for n, line in enumerate(f, start=1)]
    rows = [(n, r) for n, r in rows if is_labeled(task_kind, r)]
    with tempfile.TemporaryDirectory(prefix="tokenizer-") as tmp:
        if model is None:
            from runtime.llm import texts_of

            tok = build_char_tokenizer((t for _n, r in rows for t in texts_of(r)), Path(tmp))
        else:
            files = {n: m for n, m in model.manifest["files"].items() if n in TOKENIZER_FILES}
            storage.fetch_dir(model.storage_prefix, files, Path(tmp))
            tok = ChatTokenizer(Path(tmp))
        counts: dict[str, int] = {}
        over, longest = [], 0
        for number, row in rows:
            _example, length = encode_row(task_kind, tok, row)
            split = row.get("split", "train")
            counts[split] = counts.get(split, 0) + 1
            longest = max(longest, length)
            if length > limit:
                over.append({"row": number, "split": split, "tokens": length})
    return {
        "limit": limit,
        "rows": counts,
        "longest": longest,
        "over": len(over),
        "over_train": sum(o["split"] == "train" for o in over),
        "over_rows": over[:TOKEN_REPORT_ROWS],
    }


# Backends whose jobs run on several devices, under their framework's launcher (runner_command).
MULTI_DEVICE_BACKENDS = ("paddle", "torch")


def training_job_submit(
    *,
    actor: AbstractBaseUser,
    team: Team,
    dataset_version: DatasetVersion,
    backend: str = "paddle",
    base_model: str = "",
    preset: str = "",
    hyperparameters: dict | None = None,
    device_type: str = "cpu",
    device_count: int = 1,
    priority: int = TrainingJob.Priority.NORMAL,
    name: str = "",
    origin: TrainingJob | None = None,
    max_hours: float | None = None,
) -> TrainingJob:
    """Queue a training job on the queue of its device type. Checked and tokenised outside
    any transaction: only the job's row is written in one (SQLite's write lock is short)."""
    dataset = dataset_version.dataset
    if dataset.team_id != team.pk:
        raise ValidationError(_("No such dataset version."))
    kind = dataset.task_kind
    generative = kind in OBJECTIVES
    if kind not in HEADS and not generative:
        raise ValidationError(_("Task kind %(kind)s cannot be trained yet.") % {"kind": kind})
    if backend not in available_backends():
        raise ValidationError(
            _("No training backend named “%(b)s”; installed: %(all)s.")
            % {"b": backend, "all": ", ".join(sorted(available_backends()))}
        )
    if base_model and preset:
        raise ValidationError(_("Choose a base model or a preset, not both."))
    model = base_model_named(team, base_model, backend) if base_model else None
    if model is None:
        preset = preset or default_preset(kind)
        if preset not in presets_for(kind):
            raise ValidationError(
                _("No preset named “%(p)s” for %(kind)s; presets: %(all)s.")
                % {"p": preset, "kind": kind, "all": ", ".join(presets_for(kind))}
            )
    elif bool(model.summary.get("causal_lm")) != generative:
        raise ValidationError(
            _("%(model)s is a causal language model: it trains instruction and preference data.")
            % {"model": model.name}
            if model.summary.get("causal_lm")
            else _("%(model)s is an encoder; instruction and preference data need a causal LM.")
            % {"model": model.name}
        )
    labels = [] if generative else _job_labels(dataset_version)
    if not generative and len(labels) < (1 if kind == "ner" else 2):
        raise ValidationError(
            _("%(v)s has %(n)d label(s): a model needs at least two classes (one entity type).")
            % {"v": dataset_version, "n": len(labels)}
        )
    if not dataset_version.split_counts.get("train"):
        raise ValidationError(_("%(v)s has no rows in its train split.") % {"v": dataset_version})
    try:
        device = profile(device_type)
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc
    # Mixed precision by default where the device's profile says it is supported, in bfloat16
    # where it has it.
    given = {"amp": device.amp, "amp_dtype": "bfloat16" if device.bf16 else "float16"}
    given.update(hyperparameters or {})
    hp = _validated_hyperparameters(kind, None if model else preset, given)
    if hp.amp and not device.amp:
        raise ValidationError(
            _("Mixed precision (amp) is not supported on %(device)s.") % {"device": device.label}
        )
    if hp.amp and hp.amp_dtype == "bfloat16" and not device.bf16:
        raise ValidationError(
            _("%(device)s has no bfloat16: choose amp_dtype float16.") % {"device": device.label}
        )
    if device_count < 1:
        raise ValidationError(_("A job needs at least one device."))
    if device_count > 1 and generative:
        raise ValidationError(_("Large models train on one device for now."))
    if backend == "torch" and device.paddle_device not in ("cpu", "gpu"):
        raise ValidationError(
            _("The torch backend runs on CPUs and CUDA or ROCm cards, not on %(device)s.")
            % {"device": device.label}
        )
    if device_count > 1 and backend not in MULTI_DEVICE_BACKENDS:
        raise ValidationError(
            _(
                "Training on several devices runs on the paddle and torch backends (their "
                "launchers); the %(backend)s backend trains on one device."
            )
            % {"backend": backend}
        )
    if priority not in TrainingJob.Priority.values:
        raise ValidationError(_("Unknown priority %(p)s.") % {"p": priority})
    _check_priority(actor, team, priority)
    max_hours = _checked_max_hours(max_hours)
    nodes = live_nodes_with(device.name)
    counts = [n for _node, n in nodes]
    if nodes and placement_plan(device, counts, device_count) is None:
        most = max(counts)
        if not device.multi_node:
            raise ValidationError(
                _(
                    "No node has %(n)d %(device)s devices: the most on one node is %(most)d "
                    "(%(nodes)s). A job of this device type runs on the devices of one node."
                )
                % {
                    "n": device_count,
                    "device": device.label,
                    "most": most,
                    "nodes": ", ".join(node.name for node, n in nodes if n == most),
                }
            )
        message = _(
            "The live nodes cannot hold %(n)d %(device)s devices in equal shares (a job "
            "spans nodes with as many devices on each): they have %(counts)s."
        ) % {
            "n": device_count,
            "device": device.label,
            "counts": ", ".join(f"{node.name} {n}" for node, n in nodes),
        }
        if device.name == "cpu":
            message += " " + _(
                "A node's CPU counts as PLATFORM_CPU_SLOTS devices (1 by default): raise it "
                "there, or ask for fewer."
            )
        raise ValidationError(message)
    data_report = {}
    if generative:
        try:
            data_report = token_report(dataset_version, model, kind, hp.max_seq_length)
        except (ValueError, OSError, TemplateError) as exc:  # a template that fails, a damaged file
            raise ValidationError(_("The rows could not be tokenised: %(e)s") % {"e": exc}) from exc
        if data_report["over_train"] >= data_report["rows"].get("train", 0):
            raise ValidationError(
                _(
                    "Every training row is over the token limit of %(limit)d (the longest has "
                    "%(longest)d tokens): raise max_seq_length."
                )
                % {"limit": hp.max_seq_length, "longest": data_report["longest"]}
            )
    with transaction.atomic():
        _check_user_limit(actor)
        job = TrainingJob.objects.create(
            team=team,
            name=name.strip()[:100] or f"{dataset.name} v{dataset_version.number}",
            dataset_version=dataset_version,
            task_kind=kind,
            labels=labels,
            base_model=model,
            preset="" if model else preset,
            backend=backend,
            hyperparameters=asdict(hp),
            device_type=device.name,
            device_count=device_count,
            priority=priority,
            max_hours=max_hours,
            origin=origin,
            data_report=data_report,
            waiting_reason="" if nodes else _no_node_reason(device.name),
            celery_task_id=uuid.uuid4().hex,
            created_by=actor,
        )
        audit_record(
            action="training.job_submit",
            actor=actor,
            team=team,
            target=job,
            data={
                "dataset_version": str(dataset_version),
                "backend": backend,
                "model": job.model_source,
                "device": f"{device.name}×{device_count}",
                "origin": origin.pk if origin else None,
            },
        )
        transaction.on_commit(lambda: _enqueue(job))
    return job


def _check_priority(actor: AbstractBaseUser, team: Team, priority: int) -> None:
    """The top priority jumps every queue of shared accelerators: the team's owners and site
    staff only."""
    if priority != TrainingJob.Priority.TOP or actor.is_staff:
        return
    if not Membership.objects.filter(team=team, user=actor, role=Role.OWNER).exists():
        raise PermissionDenied(
            _("The top priority is for the team's owners and site staff; choose high at most.")
        )


def _checked_max_hours(max_hours: float | None) -> float:
    """The job's maximum run time: TRAINING_MAX_HOURS, or less if it asks for less."""
    limit = float(settings.TRAINING_MAX_HOURS)
    if max_hours is None:
        return limit
    if not 0 < max_hours <= limit:
        raise ValidationError(
            _("A job runs at most %(limit)s hours on this site (TRAINING_MAX_HOURS); %(h)s asked.")
            % {"limit": f"{limit:g}", "h": f"{max_hours:g}"}
        )
    return float(max_hours)


def _check_user_limit(actor: AbstractBaseUser) -> None:
    """Per user, over all their teams: a user in several teams (or who made several) gets no
    more than TRAINING_MAX_CONCURRENT_PER_USER queued or running jobs. Called in the job's
    transaction with the user's row locked, so that two submissions do not both pass."""
    get_user_model().objects.select_for_update().filter(pk=actor.pk).first()
    limit = settings.TRAINING_MAX_CONCURRENT_PER_USER
    active = TrainingJob.objects.filter(created_by=actor, status__in=TrainingJob.ACTIVE).count()
    if active >= limit:
        raise ValidationError(
            _(
                "You have %(n)d training jobs queued or running (in all your teams); the limit "
                "is %(limit)d a user (TRAINING_MAX_CONCURRENT_PER_USER). Wait for one to end "
                "or cancel one."
            )
            % {"n": active, "limit": limit}
        )


def _enqueue(job: TrainingJob, countdown: float | None = None) -> None:
    from training.tasks import run_training_job

    run_training_job.apply_async(
        (job.pk,),
        task_id=job.celery_task_id,
        queue=profile(job.device_type).queue,
        priority=job.priority,
        countdown=countdown,
    )


def _spec_fields(job: TrainingJob) -> dict:
    return {
        "dataset_version": job.dataset_version,
        "backend": job.backend,
        "base_model": job.base_model.name if job.base_model_id else "",
        "preset": job.preset,
        "hyperparameters": dict(job.hyperparameters),
        "device_type": job.device_type,
        "device_count": job.device_count,
        "priority": job.priority,
        # A retry keeps its limit, within the site's (which may have been lowered since).
        "max_hours": min(job.max_hours, settings.TRAINING_MAX_HOURS) if job.max_hours else None,
    }


def training_job_retry(*, actor: AbstractBaseUser, job: TrainingJob) -> TrainingJob:
    """A new job with the same spec as a failed or cancelled one."""
    if job.status not in (TrainingJob.Status.FAILED, TrainingJob.Status.CANCELLED):
        raise ValidationError(_("Only a failed or cancelled job can be retried."))
    return training_job_submit(
        actor=actor, team=job.team, origin=job, name=job.name, **_spec_fields(job)
    )


def training_job_clone(
    *, actor: AbstractBaseUser, job: TrainingJob, changes: dict[str, Any]
) -> TrainingJob:
    """A new job like ``job`` with ``changes``: hyperparameters (merged), backend, base_model,
    preset, device_type, device_count, priority, name."""
    fields = _spec_fields(job)
    unknown = set(changes) - set(fields) - {"name"}
    if unknown:
        raise ValidationError(_("Unknown field(s): %(f)s.") % {"f": ", ".join(sorted(unknown))})
    fields["hyperparameters"].update(changes.pop("hyperparameters", None) or {})
    if changes.get("base_model"):
        fields["preset"] = ""
    if changes.get("preset"):
        fields["base_model"] = ""
    fields.update(changes)
    name = fields.pop("name", "") or f"{job.name} (clone)"
    return training_job_submit(actor=actor, team=job.team, origin=job, name=name, **fields)


@transaction.atomic
def training_job_cancel(*, actor: AbstractBaseUser, job: TrainingJob) -> TrainingJob:
    """A queued job leaves the queue at once; a running one is stopped by its worker within
    about a second (its process group is killed)."""
    job = TrainingJob.objects.select_for_update().get(pk=job.pk)
    if not job.is_active:
        raise ValidationError(
            _("The job is %(status)s already; there is nothing to cancel.")
            % {"status": job.get_status_display()}
        )
    job.cancel_requested = True
    if job.status == TrainingJob.Status.QUEUED:
        job.status = TrainingJob.Status.CANCELLED
        job.finished_at = timezone.now()
        task_id = job.celery_task_id
        transaction.on_commit(lambda: _revoke(task_id))
    job.save(update_fields=["cancel_requested", "status", "finished_at"])
    audit_record(action="training.job_cancel", actor=actor, team=job.team, target=job)
    return job


def _revoke(task_id: str) -> None:
    from console.celery import app

    app.control.revoke(task_id)


# -- Running a job (on a train worker) ---------------------------------------------------------


class JobMustWait(Exception):
    pass


def training_job_wait(job_id: int, countdown: float = 5) -> None:
    """A job that must wait (its team's limit, devices held by others) comes back later."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None and job.is_active:
        _enqueue(job, countdown=countdown)


def job_workdir(job: TrainingJob) -> Path:
    return Path(settings.TRAINING_WORK_DIR) / "jobs" / str(job.pk)


def _finish(job: TrainingJob, status: str, error: str = "") -> None:
    job.status = status
    job.error = error
    job.finished_at = timezone.now()
    job.phase = ""
    job.eta_s = None
    job.save(update_fields=["status", "error", "finished_at", "phase", "eta_s"])
    audit_record(
        action=f"training.job_{status}",
        actor=None,
        actor_username="system",
        team=job.team,
        target=job,
        data={"error": error[:500]} if error else {},
    )


def training_job_claim(job_id: int, worker: str) -> TrainingJob | None:
    """Take a job for this worker, or say why not: None when it is over (cancelled, done, or
    running elsewhere), JobMustWait when the team runs as many jobs as it may or the node's
    devices are held by other jobs (the job's waiting reason says which)."""
    claimed = _claim(job_id, worker)
    if isinstance(claimed, str):
        raise JobMustWait(claimed)
    return claimed


@transaction.atomic
def _claim(job_id: int, worker: str) -> TrainingJob | str | None:
    job = TrainingJob.objects.select_related("team").filter(pk=job_id).first()
    if job is None:
        return None
    Team.objects.select_for_update().get(pk=job.team_id)  # one claim per team at a time
    job = TrainingJob.objects.select_for_update().get(pk=job_id)
    if not job.is_active:
        return None
    if job.cancel_requested:
        _finish(job, TrainingJob.Status.CANCELLED)
        return None
    now = timezone.now()
    if job.status == TrainingJob.Status.RUNNING:
        # Delivered again: its worker died, or it still runs elsewhere (then leave it be).
        if _still_running(job, now):
            return None
        if job.attempts >= settings.TRAINING_MAX_ATTEMPTS:
            _finish(
                job,
                TrainingJob.Status.FAILED,
                _(
                    "The worker running this job was lost %(n)d times (last: %(w)s); it is not "
                    "started again."
                )
                % {"n": job.attempts, "w": job.worker or "?"},
            )
            return None
    else:
        running = TrainingJob.objects.filter(
            team=job.team_id, status=TrainingJob.Status.RUNNING
        ).count()
        limit = settings.TRAINING_TEAM_CONCURRENCY
        if running >= limit:
            reason = _("Waiting: the team runs %(n)d jobs, its limit.") % {"n": running}
            if job.waiting_reason != reason:
                job.waiting_reason = reason
                job.save(update_fields=["waiting_reason"])
            return reason
    counts = [n for _node, n in live_nodes_with(job.device_type)]
    plan = placement_plan(profile(job.device_type), counts, job.device_count) or (
        1,
        job.device_count,
    )
    try:
        placed = devices_acquire(
            node_name=settings.NODE_NAME,
            device_type=job.device_type,
            count=plan[1],
            nodes=plan[0],
            holder=device_holder(job, job.attempts + 1),
            replaces=device_holder_prefix(job),
            label=f"#{job.pk} {job.name}",
            team=job.team,
        )
    except DevicesBusy as exc:
        # A job taken again after its worker died waits like any other, queued (its parts on
        # other nodes see that and stop).
        reason = str(exc)[:300]
        if job.waiting_reason != reason or job.status != TrainingJob.Status.QUEUED:
            job.waiting_reason, job.status = reason, TrainingJob.Status.QUEUED
            job.save(update_fields=["waiting_reason", "status"])
        return reason
    job.status = TrainingJob.Status.RUNNING
    job.attempts += 1
    job.worker = worker
    job.node = settings.NODE_NAME
    job.devices = [d.index for d in placed[settings.NODE_NAME]]
    # Where each part's node is reached: the launchers meet at the first one's address.
    addresses = dict(Node.objects.filter(name__in=placed).values_list("name", "address"))
    job.placement = [
        {"node": node, "address": addresses.get(node, ""), "devices": [d.index for d in held]}
        for node, held in placed.items()
    ]
    job.rendezvous = ""
    job.pid = os.getpid()
    job.started_at = job.started_at or now
    job.heartbeat_at = now
    job.waiting_reason = ""
    job.phase = "preparing"
    job.save()
    return job


def _still_running(job: TrainingJob, now) -> bool:
    """Its supervisor beats (every half second); on this node, its process is also alive and
    not this one (a node runs one worker process per device)."""
    if job.node == settings.NODE_NAME and job.pid:
        if job.pid == os.getpid() or not _alive(job.pid):
            return False
    return bool(job.heartbeat_at and (now - job.heartbeat_at).total_seconds() < 30)


def _alive(pid: int) -> bool:
    """A process that runs: not gone, and not a zombie (a pool process killed a moment ago
    that the worker has not reaped yet, while its sibling takes the job back)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _prepare_workdir(job: TrainingJob, workdir: Path) -> None:
    """spec.json, the version's rows by split, the base model's files. What an earlier attempt
    left (data, base model, checkpoint) is kept: the runner resumes from its checkpoint. That
    is first taken back from the earlier attempts' runners (their processes killed, every
    entry the platform's), and data or a base model that holds a link is fetched again."""
    if workdir.exists():
        sandbox.take_back(runner_sandbox(job), workdir, also=_earlier_attempts(job))
    workdir.mkdir(parents=True, exist_ok=True)
    base_dir = workdir / "base"
    beat = _beater(job)
    JobSpec(
        job_id=job.pk,
        task_kind=job.task_kind,
        labels=list(job.labels),
        backend=job.backend,
        preset=job.preset or None,
        base_model_dir=str(base_dir) if job.base_model_id else None,
        hyperparameters=Hyperparameters.from_dict(job.hyperparameters),
        device_type=job.device_type,
        device=runner_device(job),
        device_count=job.device_count,
        visibility_env=profile(job.device_type).visibility_env,
    ).save(workdir)
    data = workdir / "data"
    if not (data / ".complete").is_file() or not sandbox.plain(data):
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir()
        outs = {s: open(data / f"{s}.jsonl", "wb") for s in ("train", "dev", "test")}
        try:
            with default_storage.open(job.dataset_version.data_file, "rb") as f:
                for i, line in enumerate(f):
                    split = json.loads(line).get("split", "train")
                    outs.get(split, outs["train"]).write(line)
                    if i % 10000 == 0:
                        beat()
        finally:
            for out in outs.values():
                out.close()
        (data / ".complete").touch()
    if job.base_model_id and (
        not (base_dir / ".complete").is_file() or not sandbox.plain(base_dir)
    ):
        shutil.rmtree(base_dir, ignore_errors=True)
        model = job.base_model
        storage.fetch_dir(model.storage_prefix, model.manifest["files"], base_dir, beat)
        (base_dir / ".complete").touch()


def _beater(job: TrainingJob) -> Callable[[], None]:
    """A heartbeat for the job's attempt while it prepares (at most every 5 s): fetching a large
    base model must not look like a lost worker."""
    last = 0.0

    def beat() -> None:
        nonlocal last
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            TrainingJob.objects.filter(pk=job.pk, attempts=job.attempts).update(
                heartbeat_at=timezone.now()
            )

    return beat


def _die_with_parent() -> None:
    # The runner dies with the task's process: a worker killed mid-job leaves no orphan
    # holding the device (PR_SET_PDEATHSIG).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def runner_command(job: TrainingJob, workdir: Path, part: int = 0) -> list[str]:
    """The runner alone, or one process per device under the framework's launcher: Paddle's
    (``paddle.distributed.launch``) or torch's (``torchrun``), gloo between CPU processes. A
    job that spans nodes runs a launcher on each (``part`` of ``job.placement``), meeting at
    ``job.rendezvous``. The first process's output comes on our pipe, the others' go to
    ``log/``."""
    script = [str(Path(settings.BASE_DIR) / "runtime" / "run.py"), str(workdir)]
    nodes = max(len(job.placement), 1)
    n = job.device_count // nodes  # processes on this node
    if job.device_count == 1:
        return [settings.TRAINING_PYTHON, "-m", "runtime.run", str(workdir)]
    if job.backend == "torch":
        launch = [settings.TRAINING_PYTHON, "-m", "torch.distributed.run"]
        if nodes > 1:
            host, _, port = job.rendezvous.rpartition(":")
            launch += ["--nnodes", str(nodes), "--node-rank", str(part)]
            launch += ["--master-addr", host, "--master-port", port]
        else:
            # A rendezvous on a free port, so that jobs of one node do not collide.
            launch += ["--standalone", "--nnodes", "1"]
        launch += ["--nproc_per_node", str(n), "--log-dir", str(workdir / "log" / f"node-{part}")]
        if n > 1 and part == 0:  # only the job's first process speaks on our pipe
            launch += ["--redirects", ",".join(f"{r}:3" for r in range(1, n))]
        return [*launch, *script]
    launch = [settings.TRAINING_PYTHON, "-m", "paddle.distributed.launch"]
    if nodes > 1:
        launch += ["--master", job.rendezvous, "--nnodes", str(nodes), "--rank", str(part)]
        # This node's address as the others reach it: the first node serves the rendezvous
        # only if it knows the master's address for its own.
        if job.placement[part]["address"]:
            launch += ["--host", job.placement[part]["address"]]
    else:
        launch += ["--nnodes", "1"]
    launch += ["--nproc_per_node", str(n), "--log_dir", str(workdir / "log" / f"node-{part}")]
    if runner_device(job) != "cpu":
        launch += ["--devices", ",".join(str(i) for i in range(n))]
    return [*launch, *script]


def runner_env(job: TrainingJob, part: int = 0, workdir: Path | None = None) -> dict[str, str]:
    """The runner's environment: the sandbox's allowlist (runtime/sandbox.py: no secret,
    database, broker or storage setting of the platform's), its code on PYTHONPATH, its home
    and temporary files in the work directory, and the device's visibility."""
    home = workdir / "home" if workdir is not None else None
    env = sandbox.sandbox_env(
        {"PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1"}, home=home
    )
    if job.backend == "paddle":
        # paddlenlp imports `datasets`, which imports torch too when it is installed: seconds
        # of start-up for nothing. (Set per process: transformers reads it once, at import.)
        env.setdefault("USE_TORCH", "0")
        env.setdefault("USE_TF", "0")
    device = profile(job.device_type)
    if device.visibility_env:
        # The part's own cards only: the launcher and the framework number them from 0. The
        # node's indices count within the worker's own visibility, if it has one (cards kept
        # for the serving host).
        held = job.placement[part]["devices"] if job.placement else job.devices
        seen = os.environ.get(device.visibility_env, "").split(",")
        cards = [seen[i] if i < len(seen) and seen[i] else str(i) for i in held]
        env[device.visibility_env] = ",".join(cards)
    return env


def runner_sandbox(job: TrainingJob) -> sandbox.RunnerUser:
    """Whom the job's current attempt runs as where the platform is root: a uid of its own
    (PLATFORM_RUNNER_UID_BASE + a slot of the job's and attempt's) in PLATFORM_RUNNER_USER's
    group, or, with no base, PLATFORM_RUNNER_USER itself. Not root: the platform's own user."""
    return sandbox.job_user(
        settings.PLATFORM_RUNNER_USER, settings.PLATFORM_RUNNER_UID_BASE, job.pk, job.attempts
    )


def _earlier_attempts(job: TrainingJob) -> set[int]:
    """The uids of the job's other attempts (whose leftover processes a new one kills)."""
    mine = runner_sandbox(job)
    return sandbox.job_uids(settings.PLATFORM_RUNNER_UID_BASE, job.pk) - {mine.uid}


def runner_popen_args(job: TrainingJob, workdir: Path, part: int = 0) -> dict[str, Any]:
    """What the runner is started with (subprocess.Popen's arguments), by the train worker and
    by nothing else: its command, the sandbox's environment, its work directory as cwd and,
    where the platform is root, the runner's user, for whom the work directory is made its own
    and the data directory private (checked again at every start)."""
    user = runner_sandbox(job)
    (workdir / "home").mkdir(parents=True, exist_ok=True)
    if user.switch:
        sandbox.check_reachable(user, Path(settings.TRAINING_PYTHON), "the runtime's Python")
        sandbox.check_reachable(user, Path(settings.BASE_DIR) / "runtime" / "run.py", "the code")
        keep = [Path(settings.TRAINING_WORK_DIR)]
        sandbox.secure_data_dir(user, Path(settings.DATA_DIR), keep)
        sandbox.make_passage(Path(settings.TRAINING_WORK_DIR), workdir.parent)
        sandbox.give_to(user, workdir)
        sandbox.check_reachable(user, workdir, "its work directory")
    return {
        "args": runner_command(job, workdir, part),
        "cwd": workdir,
        "env": runner_env(job, part, workdir),
        **user.popen_kwargs(),
    }


def device_holder(job: TrainingJob, attempt: int | None = None) -> str:
    """An attempt of the job (its current one by default) as a holder of devices
    (console.Device.holder)."""
    return f"{device_holder_prefix(job)}{job.attempts if attempt is None else attempt}"


def device_holder_prefix(job: TrainingJob) -> str:
    """What every attempt of the job holds devices under."""
    return f"{DEVICE_HOLDER_PREFIX}{job.pk}:"


DEVICE_HOLDER_PREFIX = "training_job:"


def runner_device(job: TrainingJob) -> str:
    """The framework's device string for the job: its profile's, or the CPU on a simulated
    node (devices declared by PLATFORM_DEVICES)."""
    if Node.objects.filter(name=job.node, simulated=True).exists():
        return "cpu"
    return profile(job.device_type).paddle_device


def training_job_release_devices(job: TrainingJob) -> None:
    """The job's devices are free again (its task ended, however it ended)."""
    devices_release(device_holder(job))


class _Supervisor:
    """Reads the runner's output, stores its events, and stops it when the job is cancelled."""

    FLUSH_S = 0.5
    LOG_TAIL = 40

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.pending: list[TrainingEvent] = []
        self.fields: dict[str, Any] = {}
        self.log_tail: deque[str] = deque(maxlen=self.LOG_TAIL)
        self.error = ""
        self.cancelled = False
        # The job was taken from this attempt (started again elsewhere, or failed by one of
        # its parts on another node): the runner stops, and the job is left as it is.
        self.superseded = False
        # A job that spans nodes: its processes must meet (and start training) before the
        # runner has been silent this long.
        self.join_within: float | None = None
        self.joined = False
        self.last_event = time.monotonic()
        # Past its maximum run time (from the job's start) the runner is stopped and the job
        # fails with the reason.
        self.max_hours = job.max_hours or settings.TRAINING_MAX_HOURS
        self.deadline = (job.started_at or timezone.now()) + timezone.timedelta(
            hours=self.max_hours
        )
        self.timed_out = False
        # Whom the runner runs as: once it exits, every process left of its own uid is killed
        # (one that kept the runner's output open would keep the job running).
        self.user: sandbox.RunnerUser | None = None

    def line(self, text: str) -> None:
        text = text.rstrip("\n")
        if not text.startswith(EVENT_PREFIX):
            if text.strip():
                self.log_tail.append(text[:2000])
                self._event("log", {"message": text[:2000]})
            return
        try:
            event = json.loads(text[len(EVENT_PREFIX) :])
        except ValueError:
            return
        kind = event.pop("kind", "log")  # "t", the runner's clock, is kept: benchmarks use it
        self.last_event = time.monotonic()
        if kind == "progress":
            self.fields.update(
                step=event["step"],
                total_steps=event["total_steps"],
                epoch=event["epoch"],
                epochs=event["epochs"],
                samples_per_s=event["samples_per_s"],
                eta_s=event["eta_s"],
            )
            if self.job.first_step_at is None:
                self.job.first_step_at = self.fields["first_step_at"] = timezone.now()
            return
        if kind == "state":
            self.fields["phase"] = event["phase"]
            self.joined = self.joined or event["phase"] == "training"
        if kind == "error":
            self.error = event.get("message", "")
        self._event(kind, event)

    def _event(self, kind: str, data: dict) -> None:
        self.pending.append(
            TrainingEvent(job_id=self.job.pk, kind=kind, attempt=self.job.attempts, data=data)
        )

    def flush(self) -> None:
        if self.pending:
            TrainingEvent.objects.bulk_create(self.pending)
            self.pending = []
        TrainingJob.objects.filter(pk=self.job.pk, attempts=self.job.attempts).update(
            heartbeat_at=timezone.now(), **self.fields
        )
        self.fields = {}
        now = (
            TrainingJob.objects.filter(pk=self.job.pk)
            .values("cancel_requested", "status", "attempts")
            .first()
        )
        if now and now["cancel_requested"]:
            self.cancelled = True
        elif (
            not now
            or now["status"] != TrainingJob.Status.RUNNING
            or now["attempts"] != self.job.attempts
        ):
            self.superseded = True

    def run(self, proc: subprocess.Popen) -> int:
        # Chunks, not readline(): a buffered readline can keep a second line that arrived with
        # the first unread until the runner writes again (half a second later).
        fd = proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        pending = b""
        last_flush = 0.0
        killed_at = None
        exited_at = None
        while True:
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
                if self.user is not None:
                    sandbox.kill_processes(self.user)
            if exited_at is not None and time.monotonic() - exited_at > 5:
                break  # the runner is gone; what still holds its output is not read
            if sel.select(timeout=self.FLUSH_S):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self.line(line.decode("utf-8", "replace"))
            now = time.monotonic()
            if now - last_flush >= self.FLUSH_S:
                last_flush = now
                self.flush()
                if (self.cancelled or self.superseded) and killed_at is None:
                    killed_at = now
                    _signal_group(proc, signal.SIGTERM)
                if killed_at is None and timezone.now() >= self.deadline:
                    self.timed_out = True
                    self.error = _(
                        "The job ran past its maximum run time of %(h)s hours (TRAINING_MAX_HOURS "
                        "or the job's max_hours) and was stopped."
                    ) % {"h": f"{self.max_hours:g}"}
                    killed_at = now
                    _signal_group(proc, signal.SIGTERM)
                silent = now - self.last_event
                if (
                    self.join_within
                    and not self.joined
                    and silent > self.join_within
                    and (killed_at is None)
                ):
                    self.error = _(
                        "The job's parts on %(nodes)s did not meet within %(s)d s: is every "
                        "node's train worker up, and the first node's address reachable?"
                    ) % {
                        "nodes": ", ".join(p["node"] for p in self.job.placement),
                        "s": settings.TRAINING_RENDEZVOUS_TIMEOUT_S,
                    }
                    killed_at = now
                    _signal_group(proc, signal.SIGTERM)
            if killed_at is not None and now - killed_at > 5:
                _signal_group(proc, signal.SIGKILL)
        if pending:
            self.line(pending.decode("utf-8", "replace"))
        rc = proc.wait()
        self.flush()
        return rc


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def training_job_execute(job: TrainingJob) -> None:
    """Run a claimed job to its end: prepare, supervise the runner, register the model."""
    workdir = job_workdir(job)
    sup = _Supervisor(job)
    try:
        sup.user = runner_sandbox(job)
        _prepare_workdir(job, workdir)
    except Exception as exc:
        _finish(job, TrainingJob.Status.FAILED, _("Preparing the job failed: %(e)s") % {"e": exc})
        return
    if job.attempts > 1:
        sup._event("log", {"message": f"attempt {job.attempts}: the job starts again"})
    if len(job.placement) > 1:
        _start_parts(job, sup)
        sup.join_within = settings.TRAINING_RENDEZVOUS_TIMEOUT_S
    try:
        started = runner_popen_args(job, workdir)
    except (OSError, ValueError) as exc:
        _finish(job, TrainingJob.Status.FAILED, _("Starting the runner failed: %(e)s") % {"e": exc})
        return
    proc = subprocess.Popen(
        **started,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: cancel kills the whole tree
        preexec_fn=_die_with_parent,
    )
    try:
        rc = sup.run(proc)
    except BaseException:
        # The supervisor failed (the database went away): no runner goes on unsupervised. The
        # task is retried and the job resumes from its checkpoint.
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        sandbox.take_back(sup.user, workdir)
        raise
    if sup.superseded:
        # Another attempt (or a part's failure) decided the job's fate: this attempt's
        # processes end; its directory is the other attempt's to take.
        sandbox.kill_processes(sup.user)
        return
    # Every process left of the runner's uid is killed, and what it left is no later
    # runner's to read nor its own to change while the platform reads it.
    sandbox.take_back(sup.user, workdir)
    job.refresh_from_db()
    if sup.cancelled:
        _finish(job, TrainingJob.Status.CANCELLED)
        shutil.rmtree(workdir, ignore_errors=True)
        return
    if rc != 0 or sup.timed_out:
        reason = sup.error or _("The runner exited with status %(rc)d.") % {"rc": rc}
        tail = "\n".join(sup.log_tail)
        _finish(job, TrainingJob.Status.FAILED, f"{reason}\n\n{tail}".strip())
        return
    try:
        # What the runner (another user) left is read as the platform: no links out of it.
        outputs = [workdir / "export", workdir / "best", workdir / "evaluation.json"]
        sandbox.check_outputs(sup.user, outputs)
        model_version_register(job, workdir)
    except Exception as exc:
        _finish(
            job, TrainingJob.Status.FAILED, _("Registering the model failed: %(e)s") % {"e": exc}
        )
        return
    shutil.rmtree(workdir, ignore_errors=True)


def _start_parts(job: TrainingJob, sup: "_Supervisor") -> None:
    """A job that spans nodes: its launchers meet at a free port of this node, and every other
    node of the placement starts its part (a task on that node's own queue). The work
    directory is shared (TRAINING_WORK_DIR on NFS): the parts read its data and checkpoint."""
    from training.tasks import run_training_job_part

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    job.rendezvous = f"{job.placement[0]['address'] or '127.0.0.1'}:{port}"
    job.save(update_fields=["rendezvous"])
    nodes = ", ".join(f"{p['node']} {p['devices']}" for p in job.placement)
    sup._event("log", {"message": f"the job spans {len(job.placement)} nodes: {nodes}"})
    for part, placed in enumerate(job.placement[1:], start=1):
        run_training_job_part.apply_async(
            (job.pk, part, job.attempts), queue=f"node.{placed['node']}", priority=job.priority
        )


def training_job_part_execute(job_id: int, part: int, attempt: int) -> None:
    """One node's part of a job that spans nodes: its launcher, until the job's processes end
    (the first node supervises and reports), or the job is cancelled or started again."""

    def current() -> bool:
        running = TrainingJob.objects.filter(
            pk=job_id, status=TrainingJob.Status.RUNNING, attempts=attempt
        )
        return running.filter(cancel_requested=False).exists()

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or not current() or job.placement[part]["node"] != settings.NODE_NAME:
        return
    workdir = job_workdir(job)
    if not (workdir / "spec.json").exists():
        _fail_part(
            job_id,
            attempt,
            _(
                "Node %(node)s does not see the job's work directory %(dir)s: a job that spans "
                "nodes needs TRAINING_WORK_DIR on storage every node mounts."
            )
            % {"node": settings.NODE_NAME, "dir": workdir},
        )
        return
    # The launcher's output goes to a file of the platform's, in a directory the runner
    # cannot reach (not to its own log/, where it could plant a link for root to follow).
    logs = Path(settings.TRAINING_WORK_DIR) / "parts"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(logs, 0o700)
    log = logs / f"{job_id}-{attempt}-node-{part}.out"
    user = runner_sandbox(job)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with open(os.open(log, flags, 0o600), "wb") as out:
        proc = subprocess.Popen(
            **runner_popen_args(job, workdir, part),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    stopped_at = None
    while proc.poll() is None:
        time.sleep(1)
        try:
            going = current()
        except DatabaseError:
            continue  # the database away for a moment: the part goes on
        if not going and stopped_at is None:
            stopped_at = time.monotonic()
            _signal_group(proc, signal.SIGTERM)
        if stopped_at is not None and time.monotonic() - stopped_at > 5:
            _signal_group(proc, signal.SIGKILL)
    tail = log.read_bytes()[-1500:].decode("utf-8", "replace")
    log.unlink(missing_ok=True)
    if proc.returncode and stopped_at is None:
        # The first node's own failure, if that is what broke the collective, says more.
        time.sleep(5)
        _fail_part(
            job_id,
            attempt,
            _("Part %(part)d of the job, on node %(node)s, ended with status %(rc)d.")
            % {"part": part, "node": settings.NODE_NAME, "rc": proc.returncode}
            + "\n\n"
            + tail,
        )
    # Nothing of the part outlives the attempt. Killed once the attempt has ended: the uid is
    # the attempt's on every node, and a node may share its machine with another of the job's
    # (whose processes, still at work, are of the same uid).
    waited = time.monotonic()
    while time.monotonic() - waited < 3600:
        try:
            if not current():
                break
        except DatabaseError:
            pass
        time.sleep(1)
    sandbox.kill_processes(user)


def _fail_part(job_id: int, attempt: int, error: str) -> None:
    """A part of a job that spans nodes failed: so does the job (this attempt's, if it still
    runs); its first node sees that and stops its runner."""
    with transaction.atomic():
        job = (
            TrainingJob.objects.select_for_update()
            .filter(pk=job_id, status=TrainingJob.Status.RUNNING, attempts=attempt)
            .first()
        )
        if job is not None:
            _finish(job, TrainingJob.Status.FAILED, error)


def training_jobs_reconcile() -> list[int]:
    """Beat: a running job whose heartbeat stopped (its whole worker died, so Redis would give
    its task back only after the visibility timeout) is queued again and resumes from its
    checkpoint; devices held by jobs that ended without releasing them are freed; a queued job
    that no live node can take (no node of its device type, none with enough devices) says so.
    Returns the ids queued again."""
    with transaction.atomic():
        stale = timezone.now() - timezone.timedelta(seconds=120)
        requeued = []
        for job in TrainingJob.objects.select_for_update(skip_locked=True).filter(
            status=TrainingJob.Status.RUNNING, heartbeat_at__lt=stale
        ):
            job.celery_task_id = uuid.uuid4().hex
            job.save(update_fields=["celery_task_id"])
            transaction.on_commit(lambda job=job: _enqueue(job))
            requeued.append(job.pk)
    # Devices held by jobs that no longer run (their worker was killed before releasing).
    running = TrainingJob.objects.filter(status=TrainingJob.Status.RUNNING)
    devices_release_all_but(
        DEVICE_HOLDER_PREFIX, {device_holder(job) for job in running.only("pk", "attempts")}
    )
    counts: dict[str, list[int]] = {}  # live nodes' devices, by device type
    for job in TrainingJob.objects.filter(status=TrainingJob.Status.QUEUED):
        if job.device_type not in counts:
            counts[job.device_type] = [n for _node, n in live_nodes_with(job.device_type)]
        found = counts[job.device_type]
        too_few = _("Waiting: no live node has %(n)d %(device)s devices.") % {
            "n": job.device_count,
            "device": job.device_type,
        }
        mine = {_no_node_reason(job.device_type), too_few}
        if not found:
            reason = _no_node_reason(job.device_type)
        elif placement_plan(profile(job.device_type), found, job.device_count) is None:
            reason = too_few
        elif job.waiting_reason in mine:
            reason = ""
        else:
            continue  # a reason the worker gave (the team's limit, devices busy) stands
        if reason != job.waiting_reason:
            TrainingJob.objects.filter(pk=job.pk).update(waiting_reason=reason)
    return requeued


def _no_node_reason(device_type: str) -> str:
    return _(
        "Waiting: no live node has a %(device)s device (queue %(queue)s); see the nodes page."
    ) % {"device": device_type, "queue": profile(device_type).queue}


# -- Model versions ---------------------------------------------------------------------------


def _next_number(team: Team, name: str) -> int:
    top = ModelVersion.objects.filter(team=team, name=name).aggregate(n=Max("number"))["n"]
    return (top or 0) + 1


def model_version_register(job: TrainingJob, workdir: Path) -> ModelVersion:
    """The model of a succeeded job: its export and best checkpoint into storage (first, outside
    any transaction: a large model's copy must not hold the database's write lock), then its
    row and the job's status in one short transaction."""
    manifest = read_manifest(workdir / "export")
    evaluation = json.loads((workdir / "evaluation.json").read_text(encoding="utf-8"))
    uid = uuid.uuid4()
    prefix = f"models/{uid.hex}/"
    with tempfile.TemporaryDirectory(prefix="model-") as tmp:
        staged = Path(tmp)
        # Links are copied as links (check_outputs refused them already): never their targets.
        shutil.copytree(workdir / "export", staged / "export", symlinks=True)
        shutil.copytree(workdir / "best", staged / "checkpoint", symlinks=True)
        files = storage.store_dir(staged, prefix)
    name = job.dataset_version.dataset.name
    with transaction.atomic():
        Team.objects.select_for_update().get(pk=job.team_id)
        version = ModelVersion.objects.create(
            uid=uid,
            team=job.team,
            name=name,
            number=_next_number(job.team, name),
            job=job,
            dataset_version=job.dataset_version,
            task_kind=job.task_kind,
            labels=list(job.labels),
            backend=job.backend,
            runtime=manifest["runtime"],
            base=job.model_source,
            hyperparameters=job.hyperparameters,
            metrics={k: v for k, v in evaluation["metrics"].items() if isinstance(v, int | float)},
            evaluation=evaluation,
            manifest=manifest,
            storage_prefix=prefix,
            files=files,
            created_by=job.created_by,
        )
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        _finish(job, TrainingJob.Status.SUCCEEDED)
    return version


def model_version_archive(version: ModelVersion, out) -> None:
    """Write one .tar.gz of a model version to the binary file ``out``: model.json (what it is
    and where it came from), export/ and checkpoint/."""
    meta = {
        "format": 1,
        "name": version.name,
        "number": version.number,
        "task_kind": version.task_kind,
        "labels": version.labels,
        "backend": version.backend,
        "runtime": version.runtime,
        "base": version.base,
        "hyperparameters": version.hyperparameters,
        "metrics": version.metrics,
        "evaluation": version.evaluation,
        "files": version.files,
        "provenance": version.provenance
        or {
            "team": version.team.slug,
            "dataset": version.dataset_version.dataset.name if version.dataset_version else "",
            "dataset_version": version.dataset_version.number if version.dataset_version else None,
            "content_hash": version.dataset_version.content_hash if version.dataset_version else "",
            "job": version.job_id,
            "created_at": version.created_at.isoformat(),
        },
    }
    with tarfile.open(fileobj=out, mode="w:gz") as tf:
        raw = json.dumps(meta, ensure_ascii=False, indent=1).encode()
        info = tarfile.TarInfo("model.json")
        info.size = len(raw)
        tf.addfile(info, io.BytesIO(raw))
        for rel, meta_file in version.files.items():
            info = tarfile.TarInfo(rel)
            info.size = meta_file["size"]
            with default_storage.open(version.storage_prefix + rel, "rb") as f:
                tf.addfile(info, f)


def _manifest_after_conversion(export: Path, manifest: dict, converted: dict[str, str]) -> dict:
    """The export's manifest again after its pickled weights became safetensors (a version
    exported before they were): new files and hashes, the fields that named a pickle renamed."""
    renamed = {
        old.removeprefix(MODEL_EXPORT): new.removeprefix(MODEL_EXPORT)
        for old, new in converted.items()
        if old.startswith(MODEL_EXPORT)
    }
    fields = {k: v for k, v in manifest.items() if k not in ("files", "format")}
    for key in PATH_FIELDS:
        if fields.get(key) in renamed:
            fields[key] = renamed[fields[key]]
    write_manifest(export, **fields)
    return read_manifest(export)


def model_version_import(*, actor: AbstractBaseUser, team: Team, archive) -> ModelVersion:
    """A model version from another site's archive (``model_version_archive``), checked file by
    file against its sha256."""
    with tempfile.TemporaryDirectory(prefix="model-import-") as tmp:
        tmp_path = Path(tmp)
        local = tmp_path / "model.tar.gz"
        with open(local, "wb") as f:
            for chunk in archive.chunks():
                f.write(chunk)
        root = storage.extract_archive(local, tmp_path / "x")
        try:
            meta = json.loads((root / "model.json").read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ValidationError(_("The archive has no model.json: not a model version.")) from exc
        except ValueError as exc:
            raise ValidationError(_("model.json is not valid JSON: %(e)s") % {"e": exc}) from exc
        if not (root / "export" / MANIFEST).is_file():
            raise ValidationError(_("The archive lacks export/manifest.json."))
        try:
            manifest = read_manifest(root / "export")
            converted = weights_to_safetensors(root)
            if any(old.startswith(MODEL_EXPORT) for old in converted):
                manifest = _manifest_after_conversion(root / "export", manifest, converted)
        except (FileNotFoundError, ValueError) as exc:
            raise ValidationError(str(exc)) from exc
        (root / "model.json").unlink()
        team_storage_check(team, _dir_size(root))
        uid = uuid.uuid4()
        prefix = f"models/{uid.hex}/"
        files = storage.store_dir(root, prefix)
    name = str(meta.get("name") or "imported")[:100]
    with transaction.atomic():  # short: the files are stored already
        Team.objects.select_for_update().get(pk=team.pk)
        version = ModelVersion.objects.create(
            uid=uid,
            team=team,
            name=name,
            number=_next_number(team, name),
            source=ModelVersion.Source.IMPORTED,
            task_kind=manifest["task_kind"],
            labels=manifest["labels"],
            backend=manifest.get("backend", meta.get("backend", "")),
            runtime=manifest["runtime"],
            base=str(meta.get("base", "")),
            hyperparameters=meta.get("hyperparameters") or {},
            metrics=meta.get("metrics") or {},
            evaluation=meta.get("evaluation") or {},
            manifest=manifest,
            storage_prefix=prefix,
            files=files,
            provenance=meta.get("provenance") or {},
            created_by=actor,
        )
        audit_record(
            action="model.import",
            actor=actor,
            team=team,
            target=version,
            data={"from": meta.get("provenance", {}), "files": len(files)},
        )
    return version


# Checks that refuse to delete a model version still in use, registered by the apps that use
# model versions (deployment: one that serves traffic); each raises ValidationError.
model_version_delete_checks: list[Callable[[ModelVersion], None]] = []


@transaction.atomic
def model_version_delete(*, actor: AbstractBaseUser, version: ModelVersion) -> None:
    for check in model_version_delete_checks:
        check(version)
    prefix, files = version.storage_prefix, dict(version.files)
    audit_record(action="model.delete", actor=actor, team=version.team, target=version)
    version.delete()
    transaction.on_commit(lambda: storage.delete_prefix(prefix, files))
