"""Weights that run code, attacked as an insider would: a maintainer imports a base model (a
directory on the server, or an uploaded archive) or another site's model version whose pickled
weights call ``os.system`` when unpickled; archives that are bombs, hold too many members, or
escape their folder; a manifest naming files outside its model. Every pickle is refused at import
naming the global it asked for, the code never runs (its marker file never appears), the runner
and the serving host's engine load safetensors only, and real checkpoints (paddle.save,
torch.save) still import and train."""

import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.helpers.data import make_jsonl_version, rows_for
from tests.helpers.jobs import log_of, wait_for
from tests.helpers.models import CHARS, in_runtime
from training import storage
from training.base_models import base_model_import
from training.jobs import training_job_submit
from training.models import BaseModel, ModelVersion

# How os.system pickles on Linux: the global the refusal names.
SYSTEM = f"{os.system.__module__}.system"


class RunsCode:
    """Unpickled, this runs a shell command that leaves a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def crafted_state(marker: Path) -> bytes:
    """A "state dict" whose weight runs code: what paddle.load (and PaddleNLP) would run."""
    return pickle.dumps({"ernie.embeddings.word_embeddings.weight": RunsCode(marker)}, protocol=4)


def crafted_torch_zip(marker: Path) -> bytes:
    """The same inside PyTorch's zip layout (archive/data.pkl), as pytorch_model.bin."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", crafted_state(marker))
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


@pytest.fixture
def reviews(team, owner):
    """A labeled dataset version of the team to train on."""
    from labeling.datasets import dataset_create

    dataset = dataset_create(
        actor=owner, team=team, name="reviews", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 80)
    return make_jsonl_version(dataset, owner, rows, mapping)


@pytest.fixture
def marker(tmp_path) -> Path:
    path = tmp_path / "code-ran"
    yield path
    assert not path.exists(), "the crafted pickle ran its code"


def tar_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return buf.getvalue()


def zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def model_files(directory: Path, prefix: str = "model/") -> dict[str, bytes]:
    return {prefix + p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def import_archive(client, team, data: bytes, name: str = "model.tar.gz", backend="paddle"):
    client.force_login(team.memberships.first().user)
    return client.post(
        reverse("training:api_base_models", kwargs={"team": team.slug}),
        {"name": "evil", "backend": backend, "archive": SimpleUploadedFile(name, data)},
        HTTP_ACCEPT_LANGUAGE="en",
    )


def import_torch_bin(client, team, vocab_from: Path, weights: bytes):
    """Upload a BERT (the vocabulary of ``vocab_from``) whose pytorch_model.bin is ``weights``;
    the response."""
    config = json.dumps({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2})
    files = {
        "model/config.json": config.encode(),
        "model/vocab.txt": (vocab_from / "vocab.txt").read_bytes(),
        "model/pytorch_model.bin": weights,
    }
    return import_archive(client, team, tar_of(files), backend="torch")


def detail(response) -> str:
    return " ".join(map(str, response.json().get("detail", [response.json()])))


# -- Crafted pickles at import ------------------------------------------------------------------


def test_a_crafted_pdparams_in_a_server_directory_is_refused_naming_the_global(
    team, owner, paddle_base, marker
):
    evil = settings.MODEL_IMPORT_DIR / "evil-ernie"
    shutil.copytree(paddle_base, evil, dirs_exist_ok=True)
    (evil / "model_state.pdparams").write_bytes(crafted_state(marker))
    with pytest.raises(Exception, match=rf"model_state\.pdparams asks for {SYSTEM}") as exc:
        base_model_import(actor=owner, team=team, name="evil", path="evil-ernie")
    assert "weights may only hold arrays" in str(exc.value)
    assert not BaseModel.objects.exists()


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_a_crafted_pdparams_in_an_uploaded_archive_is_refused(
    client, team, paddle_base, marker, fmt
):
    files = model_files(paddle_base) | {"model/model_state.pdparams": crafted_state(marker)}
    data = tar_of(files) if fmt == "tar.gz" else zip_of(files)
    response = import_archive(client, team, data, f"model.{fmt}")
    assert response.status_code == 400, response.content
    assert f"model_state.pdparams asks for {SYSTEM}" in detail(response)
    assert not BaseModel.objects.exists()


@pytest.mark.parametrize("layout", ["zip", "legacy"])
def test_a_crafted_pytorch_model_bin_is_refused(client, team, paddle_base, marker, layout):
    weights = crafted_torch_zip(marker) if layout == "zip" else crafted_state(marker)
    response = import_torch_bin(client, team, paddle_base, weights)
    assert response.status_code == 400, response.content
    assert f"pytorch_model.bin asks for {SYSTEM}" in detail(response)
    assert not BaseModel.objects.exists()


# -- Checkpoints that ask for more memory than they hold ----------------------------------------


def _g(module: str, name: str) -> bytes:  # GLOBAL
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _s(text: str) -> bytes:  # BINUNICODE
    return b"X" + len(text.encode()).to_bytes(4, "little") + text.encode()


def _i(n: int) -> bytes:  # BININT
    return b"J" + n.to_bytes(4, "little", signed=True)


def _tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def _torch_tensor(numel: int, size: tuple, stride: tuple) -> bytes:
    """``_rebuild_tensor_v2(storage "0" of ``numel`` floats, 0, size, stride, False, {})``."""
    storage = _tuple(_s("storage"), _g("torch", "FloatStorage"), _s("0"), _s("cpu"), _i(numel))
    args = _tuple(storage + b"Q", _i(0), _tuple(*map(_i, size)), _tuple(*map(_i, stride)), b"\x89}")
    return _g("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def _pickle_of(items: dict[str, bytes]) -> bytes:
    return b"\x80\x02}" + b"".join(_s(k) + v + b"s" for k, v in items.items()) + b"."


def _torch_zip(data_pkl: bytes, storage: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # stored, as torch.save writes it
        zf.writestr("archive/data.pkl", data_pkl)
        zf.writestr("archive/data/0", storage)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def _nested(depth: int) -> bytes:
    """{"a": {"a": … {} …}} ``depth`` deep, written without recursion."""
    return b"\x80\x02" + (b"}" + _s("a")) * depth + b"}" + b"s" * depth + b"."


ASKS_TOO_MUCH = {
    # A 4-byte storage seen as 10**8 x 10**8 floats with stride 0: a copy of 35 PiB.
    "stride-0": (
        _torch_zip(_pickle_of({"w": _torch_tensor(1, (10**8, 10**8), (0, 0))}), b"\0" * 4),
        "elements overlap",
    ),
    # Strides that fold back onto the same elements (a 4 x 4 view of four floats).
    "overlap": (
        _torch_zip(_pickle_of({"w": _torch_tensor(4, (4, 4), (1, 0))}), b"\0" * 16),
        "elements overlap",
    ),
    # numpy.ndarray called directly: 4 MB of floats (8 GB with 2**31) from a 60-byte pickle.
    "ndarray": (
        _pickle_of({"w": _g("numpy", "ndarray") + _tuple(_tuple(_i(1 << 20)), _s("f4")) + b"R"}),
        "numpy.ndarray is called directly",
    ),
    # 200 names of one 64 KB storage: 13 MB of safetensors from a 70 KB file.
    "shared-storage": (
        _torch_zip(
            _pickle_of({f"w{i}": _torch_tensor(16384, (16384,), (1,)) for i in range(200)}),
            b"\0" * 65536,
        ),
        "more than the file holds",
    ),
    # A BUILD on an allowed function: setattr(_rebuild_parameter, "__defaults__", (1,)).
    "build-on-a-function": (
        _pickle_of(
            {
                "w": _g("torch._utils", "_rebuild_parameter")
                + b"N}"
                + _s("__defaults__")
                + _tuple(_i(1))
                + b"s\x86b"
            }
        ),
        "cannot be given a state",
    ),
    # An array of Python objects (dtype "O"), refused when its dtype is made.
    "object-dtype": (
        _pickle_of({"w": _g("numpy", "dtype") + _tuple(_s("O8"), b"\x89", b"\x88") + b"R"}),
        "Python objects",
    ),
    # Nested 50,000 deep: the walk through the state dict would overflow the stack.
    "nested": (_nested(50_000), "nesting"),
}


@pytest.mark.parametrize("attack", ASKS_TOO_MUCH)
def test_a_checkpoint_asking_for_more_than_it_holds_is_refused(client, team, paddle_base, attack):
    """A few bytes of pytorch_model.bin that would make the import allocate (or write)
    gigabytes, or tamper with the unpickler's own functions: 400 naming what was wrong."""
    from runtime import weights as converter

    crafted, message = ASKS_TOO_MUCH[attack]
    response = import_torch_bin(client, team, paddle_base, crafted)
    assert response.status_code == 400, response.content
    assert "pytorch_model.bin" in detail(response) and message in detail(response)
    assert not BaseModel.objects.exists()
    assert converter._rebuild_parameter.__defaults__ is None


def test_links_in_a_server_directory_are_refused(team, owner, paddle_base):
    """A model directory under MODEL_IMPORT_DIR whose file links to the platform's secrets (or
    another team's model): copying it would follow the link into the team's model."""
    secret = settings.MODEL_IMPORT_DIR.parent / "secret_key"
    secret.write_text("the platform's secret")
    linked = settings.MODEL_IMPORT_DIR / "linked-ernie"
    shutil.copytree(paddle_base, linked, dirs_exist_ok=True)
    (linked / "notes.txt").symlink_to(secret)
    try:
        with pytest.raises(Exception, match=r"notes\.txt is a symbolic link") as exc:
            base_model_import(actor=owner, team=team, name="linked", path="linked-ernie")
        assert "may not hold links" in str(exc.value)
        assert not BaseModel.objects.exists()
    finally:
        shutil.rmtree(linked)
        secret.unlink()


def _version_archive(export: dict[str, bytes], checkpoint: dict[str, bytes], **manifest) -> bytes:
    fields = {
        "format": 1,
        "tokenizer": {"type": "chat", "file": "tokenizer.json"},
        "task_kind": "instruction",
        "labels": [],
        "runtime": "paddle_generate",
        "backend": "paddle",
        "model_file": "model_state.pdparams",
        "files": {n: hashlib.sha256(d).hexdigest() for n, d in export.items()},
        **manifest,
    }
    meta = {"format": 1, "name": "from-elsewhere", "backend": "paddle", "files": {}}
    return tar_of(
        {
            "model.json": json.dumps(meta).encode(),
            "export/manifest.json": json.dumps(fields).encode(),
            **{f"export/{n}": d for n, d in export.items()},
            **{f"checkpoint/{n}": d for n, d in checkpoint.items()},
        }
    )


def import_version(client, team, data: bytes):
    client.force_login(team.memberships.first().user)
    return client.post(
        reverse("training:api_models", kwargs={"team": team.slug}),
        {"archive": SimpleUploadedFile("model.tar.gz", data)},
        HTTP_ACCEPT_LANGUAGE="en",
    )


@pytest.mark.parametrize("where", ["export", "checkpoint"])
def test_a_model_version_archive_with_a_crafted_pickle_is_refused(client, team, marker, where):
    evil = {"model_state.pdparams": crafted_state(marker), "config.json": b"{}"}
    archive = (
        _version_archive(evil, {})
        if where == "export"
        else _version_archive(
            {"config.json": b"{}"},
            {"trained.pdparams": evil.pop("model_state.pdparams")},
            model_file="config.json",
        )
    )
    response = import_version(client, team, archive)
    assert response.status_code == 400, response.content
    assert f"asks for {SYSTEM}" in detail(response)
    assert not ModelVersion.objects.exists()


def test_a_model_version_from_a_site_that_pickled_its_weights_still_imports(client, team, tmp_path):
    """An archive of another site's version made before weights were safetensors: its pickles
    (paddle.save's layout: name → (tensor name, array)) become safetensors, the manifest
    follows, and the stored version holds no pickle."""
    import numpy as np
    from safetensors.numpy import load_file

    weight = np.arange(12, dtype="float32").reshape(3, 4)
    state = pickle.dumps({"lm_head.weight": ("linear_0.w_0", weight)}, protocol=4)
    archive = _version_archive(
        {"model_state.pdparams": state, "config.json": b"{}"}, {"trained.pdparams": state}
    )
    response = import_version(client, team, archive)
    assert response.status_code == 201, response.content
    version = ModelVersion.objects.get()
    assert version.manifest["model_file"] == "model.safetensors"
    assert set(version.files) == {
        "export/manifest.json",
        "export/config.json",
        "export/model.safetensors",
        "checkpoint/trained.safetensors",
    }
    with default_storage.open(version.storage_prefix + "export/model.safetensors", "rb") as f:
        (tmp_path / "model.safetensors").write_bytes(f.read())
    converted = load_file(str(tmp_path / "model.safetensors"))
    assert np.array_equal(converted["lm_head.weight"], weight)


@pytest.mark.parametrize("path", ["/etc/hostname", "../../../../etc/hostname"])
def test_an_imported_manifest_naming_a_path_outside_its_model_is_refused(client, team, path):
    data = Path("/etc/hostname").read_bytes()
    archive = _version_archive({"config.json": b"{}"}, {}, model_file="config.json")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    manifest = json.loads(members["export/manifest.json"])
    manifest["files"][path] = hashlib.sha256(data).hexdigest()
    members["export/manifest.json"] = json.dumps(manifest).encode()
    response = import_version(client, team, tar_of(members))
    assert response.status_code == 400, response.content
    assert "outside the model" in detail(response)
    assert not ModelVersion.objects.exists()


# -- Archives -----------------------------------------------------------------------------------


def test_a_zip_bomb_is_refused_before_it_is_extracted(client, team, paddle_base):
    bomb = model_files(paddle_base) | {"model/padding.txt": b"\0" * (16 << 20)}
    data = zip_of(bomb)
    assert len(data) < 1 << 20  # 16 MB of zeros pack into a few kilobytes
    response = import_archive(client, team, data, "model.zip")
    assert response.status_code == 400, response.content
    assert "zip bomb" in detail(response) and "padding.txt" in detail(response)
    assert not BaseModel.objects.exists()


def test_too_many_members_or_too_large_an_archive_is_refused(client, team, paddle_base, settings):
    settings.ARCHIVE_MAX_MEMBERS = 20
    many = model_files(paddle_base) | {f"model/extra/{i}.txt": b"x" for i in range(30)}
    response = import_archive(client, team, tar_of(many))
    assert response.status_code == 400 and "more than 20 files" in detail(response)
    settings.ARCHIVE_MAX_MEMBERS = 10000
    settings.ARCHIVE_MAX_UNCOMPRESSED_BYTES = 1 << 20
    large = model_files(paddle_base) | {"model/noise.bin.txt": os.urandom(2 << 20)}
    response = import_archive(client, team, tar_of(large))
    assert response.status_code == 400 and "more than 1 MB" in detail(response)
    assert not BaseModel.objects.exists()


@pytest.mark.parametrize(
    ("fmt", "files", "links"),
    [
        ("zip", {"../escaped.txt": b"hi"}, None),
        ("tar.gz", {"/etc/absolute.txt": b"hi"}, None),
        ("tar.gz", {}, {"model/vocab-link.txt": "vocab.txt"}),
    ],
    ids=["dotdot", "absolute", "symlink"],
)
def test_members_outside_the_archive_and_links_are_refused(
    client, team, paddle_base, fmt, files, links
):
    members = model_files(paddle_base) | files
    data = zip_of(members) if fmt == "zip" else tar_of(members, links)
    response = import_archive(client, team, data, f"model.{fmt}")
    assert response.status_code == 400, response.content
    assert "outside itself" in detail(response) or "link" in detail(response)
    assert not BaseModel.objects.exists()


# -- The runner and the serving host's engine load safetensors only ------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_runner_never_unpickles_a_stored_pickle(
    team, owner, reviews, train_worker, paddle_base, tmp_path
):
    """A base model stored before weights were converted (or put in storage by other means)
    with a crafted model_state.pdparams: the job fails, naming the pickle it will not load, and
    the code never runs on the train node."""
    # Where the runner (an unprivileged user where the suite runs as root) could write, so that
    # code that ran would leave its marker.
    drop = Path(tempfile.mkdtemp(prefix="code-ran-"))
    drop.chmod(0o777)
    marker = drop / "marker"
    staged = tmp_path / "stored"
    shutil.copytree(paddle_base, staged)
    (staged / "model_state.pdparams").write_bytes(crafted_state(marker))
    prefix = "base_models/crafted/"
    files = storage.store_dir(staged, prefix)
    BaseModel.objects.create(
        team=team,
        name="stored-evil",
        backend="paddle",
        architecture="ernie",
        manifest={"files": files},
        storage_prefix=prefix,
        created_by=owner,
    )
    try:
        job = training_job_submit(
            actor=owner,
            team=team,
            dataset_version=reviews,
            base_model="stored-evil",
            hyperparameters={"epochs": 1, "max_seq_length": 32},
        )
        job = wait_for(job)
        assert job.status == "failed", log_of(job)
        assert "model_state.pdparams" in job.error and "never loads" in job.error, log_of(job)
        assert not marker.exists(), "the runner unpickled the crafted weights"
    finally:
        storage.delete_prefix(prefix, files)
        shutil.rmtree(drop, ignore_errors=True)


GENERATE = """
import sys, pathlib
from runtime.generation import PaddleLM
try:
    PaddleLM.load(pathlib.Path(sys.argv[1]), "cpu")
except Exception as exc:
    print("refused:", type(exc).__name__, exc)
"""


def test_the_generation_engine_never_unpickles_paddle_weights(tmp_path, marker):
    """A paddle_generate export with a crafted model_state.pdparams (an old version, or one
    placed on the serving host's disk): the engine that serving runs loads safetensors only."""
    export = tmp_path / "export"
    export.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": 32,
    }
    (export / "config.json").write_text(json.dumps(config))
    (export / "model_state.pdparams").write_bytes(crafted_state(marker))
    out = subprocess.run(
        [settings.TRAINING_PYTHON, "-c", GENERATE, str(export)],
        cwd=settings.BASE_DIR,
        env={"PYTHONPATH": str(settings.BASE_DIR), "PATH": "/usr/bin:/bin", "USE_TORCH": "0"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert not marker.exists()


# -- Real checkpoints still import and train -----------------------------------------------------

MAKE_HF_BIN = """
import pathlib, sys
from transformers import BertConfig, BertModel
from runtime.tokenizer import CharTokenizer
d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True)
tok = CharTokenizer.build([sys.argv[2]])
tok.save(d / "vocab.txt")
BertModel(BertConfig(vocab_size=len(tok.vocab), hidden_size=64, num_hidden_layers=2,
          num_attention_heads=2, intermediate_size=128)).save_pretrained(
          str(d), safe_serialization=False)
"""
SAME_TENSORS = """
import sys, torch
from safetensors.torch import load_file
saved = torch.load(sys.argv[1], weights_only=True)
converted = load_file(sys.argv[2])
assert saved.keys() == converted.keys(), (saved.keys() ^ converted.keys())
assert all(torch.equal(saved[k], converted[k]) for k in saved)
print("same")
"""


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_saved_by_torch_save_imports_as_safetensors_and_trains(
    team, owner, reviews, train_worker, tmp_path
):
    source = settings.MODEL_IMPORT_DIR / "bert-bin"
    if not source.exists():
        in_runtime(MAKE_HF_BIN, str(source), CHARS)
    assert (source / "pytorch_model.bin").is_file()
    model = base_model_import(
        actor=owner, team=team, name="bert-bin", backend="torch", path="bert-bin"
    )
    assert "model.safetensors" in model.manifest["files"]
    assert not any(n.endswith(".bin") for n in model.manifest["files"])
    stored = tmp_path / "model.safetensors"
    with default_storage.open(model.storage_prefix + "model.safetensors", "rb") as f:
        stored.write_bytes(f.read())
    assert (
        in_runtime(SAME_TENSORS, str(source / "pytorch_model.bin"), str(stored)).strip() == "same"
    )
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=reviews,
        backend="torch",
        base_model="bert-bin",
        hyperparameters={"epochs": 2, "learning_rate": 1e-3, "max_seq_length": 32},
    )
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    assert job.model_version.evaluation["metrics"]["support"] > 0
