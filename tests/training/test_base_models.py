"""Base models imported from disk (a directory or an archive, on the server or uploaded), checked
file by file; jobs that fine-tune them; a name that is not imported is refused with the list."""

import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.helpers.jobs import wait_for
from tests.helpers.models import CHARS, MAKE_HF, model_dir
from training.base_models import base_model_import, inspect_model_dir
from training.jobs import training_job_submit
from training.models import BaseModel


@pytest.fixture(scope="session")
def hf_base(django_db_setup) -> Path:
    """A BERT in Hugging Face layout, under the import directory of the server."""
    return model_dir(MAKE_HF, "bert-mini", CHARS)


def _archive(directory: Path, fmt: str) -> SimpleUploadedFile:
    buf = io.BytesIO()
    if fmt == "zip":
        with zipfile.ZipFile(buf, "w") as zf:
            for p in directory.iterdir():
                zf.write(p, f"model/{p.name}")
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            tf.add(directory, arcname="model")
    return SimpleUploadedFile(f"model.{fmt}", buf.getvalue())


def test_a_directory_on_the_server_is_imported_with_the_sha256_of_each_file(
    team, owner, paddle_base
):
    model = base_model_import(actor=owner, team=team, name="ernie-mini", path="ernie-mini")
    assert model.backend == "paddle" and model.architecture == "ernie"
    assert model.summary["layers"] == 2 and model.summary["hidden_size"] == 64
    files = model.manifest["files"]
    # The pickled weights are stored converted to safetensors; the server's copy is untouched.
    assert set(files) == {
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.txt",
    }
    assert (paddle_base / "model_state.pdparams").is_file()
    assert model.summary["converted"] == {"model_state.pdparams": "model.safetensors"}
    for name, meta in files.items():
        with default_storage.open(model.storage_prefix + name, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        assert meta["sha256"] == digest
        if name != "model.safetensors":
            assert hashlib.sha256((paddle_base / name).read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_an_uploaded_archive_is_imported(team, owner, paddle_base, fmt):
    model = base_model_import(actor=owner, team=team, name="up", archive=_archive(paddle_base, fmt))
    assert len(model.manifest["files"]) == 4
    assert model.source == f"model.{fmt}"


def test_a_missing_file_is_named(team, owner, paddle_base, tmp_path):
    broken = settings.MODEL_IMPORT_DIR / "no-vocab"
    shutil.copytree(paddle_base, broken, dirs_exist_ok=True)
    (broken / "vocab.txt").unlink()
    with pytest.raises(ValidationError, match=r"vocab\.txt"):
        base_model_import(actor=owner, team=team, name="x", path="no-vocab")
    weightless = _without(paddle_base, tmp_path, "model_state.pdparams")
    with pytest.raises(ValidationError, match=r"model_state\.pdparams or model\.safetensors"):
        inspect_model_dir(weightless, "paddle")
    assert not BaseModel.objects.exists()


def _without(src: Path, tmp: Path, name: str) -> Path:
    target = tmp / f"without-{name}"
    shutil.copytree(src, target)
    (target / name).unlink()
    return target


def test_an_architecture_the_backend_cannot_build_is_refused(team, owner, paddle_base, tmp_path):
    other = tmp_path / "gpt"
    shutil.copytree(paddle_base, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValidationError, match="gpt2"):
        inspect_model_dir(other, "paddle")


def test_paths_outside_the_import_directory_and_escaping_archives_are_refused(
    team, owner, tmp_path
):
    with pytest.raises(ValidationError, match="outside"):
        base_model_import(actor=owner, team=team, name="x", path="../../etc")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(ValidationError):
        base_model_import(
            actor=owner, team=team, name="x", archive=SimpleUploadedFile("m.tar.gz", buf.getvalue())
        )
    assert not BaseModel.objects.exists()


def test_a_base_model_that_is_not_imported_is_refused_with_what_is(
    client, team, owner, make_dataset, paddle_base
):
    base_model_import(actor=owner, team=team, name="ernie-mini", path="ernie-mini")
    version = make_dataset()
    with pytest.raises(ValidationError) as exc:
        training_job_submit(
            actor=owner, team=team, dataset_version=version, base_model="ernie-3.0-base-zh"
        )
    message = " ".join(exc.value.messages)
    assert "ernie-3.0-base-zh" in message and "Imported: ernie-mini" in message
    client.force_login(owner)
    response = client.post(
        reverse("training:api_jobs", kwargs={"team": team.slug}),
        {
            "dataset_id": version.dataset_id,
            "dataset_version": version.number,
            "base_model": "ernie-3.0-base-zh",
        },
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "ernie-3.0-base-zh" in response.json()["detail"][0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_a_job_fine_tunes_an_imported_base_model(
    team, owner, make_dataset, train_worker, paddle_base, hf_base, backend
):
    path = {"paddle": "ernie-mini", "torch": "bert-mini"}[backend]
    base_model_import(actor=owner, team=team, name=path, backend=backend, path=path)
    version = make_dataset()
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        backend=backend,
        base_model=path,
        hyperparameters={"epochs": 3, "learning_rate": 1e-3, "max_seq_length": 32},
    )
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    assert job.model_version.base == path
    assert job.model_version.evaluation["metrics"]["support"] > 0


def test_the_api_imports_a_base_model_by_path_and_by_upload(client, team, owner, paddle_base):
    client.force_login(owner)
    url = reverse("training:api_base_models", kwargs={"team": team.slug})
    by_path = client.post(
        url, {"name": "ernie-mini", "path": "ernie-mini"}, content_type="application/json"
    )
    assert by_path.status_code == 201, by_path.content
    assert by_path.json()["summary"]["layers"] == 2 and not by_path.json()["shared"]
    owner.is_staff = True  # only site staff share a model with every team
    owner.save()
    upload = client.post(
        url, {"name": "shared", "archive": _archive(paddle_base, "zip"), "shared": "true"}
    )
    assert upload.status_code == 201, upload.content
    assert upload.json()["shared"] and upload.json()["source"] == "model.zip"
    assert [m["name"] for m in client.get(url).json()["results"]] == ["ernie-mini", "shared"]
    missing = client.post(url, {"name": "x", "path": "nowhere"}, content_type="application/json")
    assert missing.status_code == 400 and "does not exist" in missing.json()["detail"][0]
