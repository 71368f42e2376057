"""Base models: the pretrained models a team (or, shared, the whole site) trains from,
imported from files carried into the site and never downloaded. Their check
(``inspect_model_dir``: the files and architecture each backend needs; a causal LM's tokenizer
and chat template), pickled weights converted to safetensors, import, sharing with every team,
and a fine-tuned large model taken as the base of further jobs."""

import json
import shutil
import tempfile
import uuid
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils.translation import gettext as _
from jinja2 import TemplateError

from console.models import Team
from console.quotas import team_storage_check
from console.services import audit_record
from runtime import weights
from runtime.estimate import causal_lm_summary
from runtime.inference import MANIFEST
from runtime.kinds import GENERATIVE_KINDS
from runtime.tokenizer import CharTokenizer
from training import storage
from training.models import BaseModel, ModelVersion, TrainingJob

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
    from runtime.chat import check_template
    from runtime.chat_template import ChatTemplateError

    try:
        check_template(directory)  # a template that loops for ever is refused here
    except (ChatTemplateError, TemplateError) as exc:
        raise ValidationError(
            _("The model's chat template cannot be used: %(e)s") % {"e": exc}
        ) from exc
    summary = causal_lm_summary(config)
    return {**summary, "architecture": arch, "weights_file": weights[0]}


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


def _checked_and_stored(directory: Path, backend: str, team: Team | None) -> tuple[dict, str, dict]:
    """An import's checks and copy, for a directory to take as a base model: pickled weights
    converted, the files checked (``inspect_model_dir``), the team's storage quota (none for a
    model of the site), each file stored with its sha256. Returns the summary, the storage
    prefix and the files' manifest."""
    converted = weights_to_safetensors(directory)
    summary = inspect_model_dir(directory, backend)
    if converted:
        summary["converted"] = converted
    if team is not None:
        team_storage_check(team, storage.dir_size(directory))
    prefix = f"base_models/{uuid.uuid4().hex}/"
    return summary, prefix, storage.store_dir(directory, prefix)


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
        summary, prefix, files = _checked_and_stored(directory, backend, owner)
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
    if version.task_kind not in GENERATIVE_KINDS:
        raise ValidationError(
            _("Only large models (instruction, preference) continue training as a base model.")
        )
    if BaseModel.objects.filter(team=version.team, name=name).exists():
        raise ValidationError(_("A base model named “%(name)s” exists already.") % {"name": name})
    files = {
        rel.removeprefix(storage.MODEL_EXPORT): meta
        for rel, meta in version.files.items()
        if rel.startswith(storage.MODEL_EXPORT)
        and rel != storage.MODEL_EXPORT + MANIFEST
        and not rel.startswith(storage.MODEL_EXPORT + "adapter/")  # the merged weights hold it
    }
    with tempfile.TemporaryDirectory(prefix="base-model-") as tmp:
        directory = Path(tmp)
        storage.fetch_dir(version.storage_prefix + storage.MODEL_EXPORT, files, directory)
        weights_to_safetensors(directory)  # versions exported before weights were safetensors
        summary = inspect_model_dir(directory, version.backend)
        team_storage_check(version.team, storage.dir_size(directory))
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


# What a pretraining's best/ holds besides the model's files (the loop's own marker).
_PRETRAINING_LEFT_OUT = ("state.json",)


def base_model_from_job(job: TrainingJob, workdir: Path) -> BaseModel:
    """The result of a pretraining job (objective "mlm", runtime.mlm): its ``best/`` taken as a
    base model of the job's team, named as the job, through an import's checks and copy; its
    held-out figures go into the summary. The job succeeds in the same short transaction."""
    from training.jobs import training_job_finish

    evaluation = json.loads((workdir / "evaluation.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="base-model-") as tmp:
        directory = Path(tmp) / "x"
        _refuse_links(workdir / "best")
        shutil.copytree(
            workdir / "best",
            directory,
            symlinks=True,
            ignore=shutil.ignore_patterns(*_PRETRAINING_LEFT_OUT),
        )
        summary, prefix, files = _checked_and_stored(directory, job.backend, job.team)
    summary["pretraining"] = {
        "job": job.pk,
        "dataset_version": str(job.dataset_version),
        "base": job.model_source,
        **{k: evaluation.get(k) for k in ("metrics", "initial", "texts", "windows", "rows")},
    }
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if BaseModel.objects.filter(team=job.team, name=job.name).exists():
            raise ValidationError(
                _("A base model named “%(name)s” exists already.") % {"name": job.name}
            )
        model = BaseModel.objects.create(
            team=job.team,
            name=job.name,
            backend=job.backend,
            architecture=summary["architecture"],
            summary=summary,
            manifest={"files": files},
            storage_prefix=prefix,
            source=f"{job.dataset_version} (pretraining job {job.pk})",
            job=job,
            created_by=job.created_by,
        )
        audit_record(
            action="base_model.pretrain",
            actor=None,
            actor_username="system",
            team=job.team,
            target=model,
            data={"job": job.pk, "dataset_version": str(job.dataset_version)},
        )
        training_job_finish(job, TrainingJob.Status.SUCCEEDED)
    return model
