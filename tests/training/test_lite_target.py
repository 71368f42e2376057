"""A fast model's Paddle Lite target as the registry keeps it: a job's work directory made by
the real runner on a node whose targets include lite, registered like any job's: the version
lists lite ready (with its agreement), downloads it as a folder of its own (``model.nb`` for
x86, ``model.arm.nb`` for ARM devices, the manifest with their sha256s), and a lite folder
whose files were changed after the runner checked them is not kept."""

import io
import subprocess
import tarfile

import pytest
from django.urls import reverse

from console.services import api_token_create
from runtime import lite
from runtime.presets import recommended
from tests.deployment.fixtures import _run_runner
from tests.helpers.workdir import make_workdir
from training.models import TrainingJob
from training.registry import (
    model_version_register,
    model_version_target_archive,
    model_version_targets,
)

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = [
    pytest.mark.xdist_group("lite-target"),
    pytest.mark.django_db,
    pytest.mark.skipif(lite.lite_python() is None, reason="no lite venv (.venv-lite)"),
]
PRESET = "ngram-bag-char"
# Small tables: the conversion stays fast.
SMALL = {"embedding_size": 32, "buckets": 4000, "wide_buckets": 4096}


@pytest.fixture(scope="module")
def lite_workdir(tmp_path_factory):
    """A trained fast classifier's work directory, its targets made with lite among them."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PLATFORM_EXPORT_TARGETS", "onnx,lite")
    try:
        hp = recommended("text_classification", preset=PRESET)
        workdir, spec = make_workdir(
            tmp_path_factory.mktemp("lite-job"),
            "text_classification",
            sizes=(120, 20, 40),
            learning_rate=hp.learning_rate,
            epochs=4,
        )
        spec.backend, spec.preset, spec.model_config = "paddle", PRESET, SMALL
        spec.save(workdir)
        _run_runner(workdir, "paddle")
    finally:
        mp.undo()
    return workdir


def _job(team, owner, make_dataset, workdir) -> TrainingJob:
    from runtime.spec import JobSpec

    spec = JobSpec.load(workdir)
    return TrainingJob.objects.create(
        team=team,
        name="lite",
        dataset_version=make_dataset(),
        task_kind=spec.task_kind,
        labels=list(spec.labels),
        preset=PRESET,
        backend="paddle",
        status=TrainingJob.Status.RUNNING,
        created_by=owner,
    )


def test_a_fast_models_lite_target_is_kept_and_downloads_with_its_manifest(
    team, owner, make_dataset, lite_workdir
):
    version = model_version_register(_job(team, owner, make_dataset, lite_workdir), lite_workdir)
    targets = {t["name"]: t for t in model_version_targets(version)}
    assert list(targets) == ["paddle_inference", "lite", "onnx"]
    assert targets["lite"]["status"] == "ready" and targets["lite"]["runtime"] == "paddle_lite"
    assert targets["lite"]["agreement"] == 1.0, targets

    out = io.BytesIO()
    assert model_version_target_archive(version, "lite", out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tf:
        names = {m.name.split("/", 1)[-1] for m in tf.getmembers() if m.isfile()}
    assert {"model.nb", "model.arm.nb", "manifest.json", "vocab.txt"} <= names, names


def test_a_lite_target_changed_after_the_runner_checked_it_is_not_kept(
    team, owner, make_dataset, lite_workdir, tmp_path
):
    import shutil

    workdir = tmp_path / "job"
    shutil.copytree(lite_workdir, workdir)
    with open(workdir / "targets" / "lite" / "model.nb", "ab") as f:
        f.write(b"\0")  # the runner's user wrote something else after the check
    version = model_version_register(_job(team, owner, make_dataset, workdir), workdir)
    lite_target = next(t for t in model_version_targets(version) if t["name"] == "lite")
    assert lite_target["status"] == "failed" and "do not check out" in lite_target["error"]
    assert not model_version_target_archive(version, "lite", io.BytesIO())


def test_a_lite_edge_bundle_reproduces_the_reports_predictions_in_a_clean_python_310_venv(
    client, team, owner, make_dataset, lite_workdir, tmp_path
):
    """Downloaded through the API, unpacked, installed into an empty venv of Python 3.10 with
    nothing but paddlelite and numpy: its predictor gives the report's outputs."""
    version = model_version_register(_job(team, owner, make_dataset, lite_workdir), lite_workdir)
    client.force_login(owner)
    page = reverse("training:model", kwargs={"team": team.slug, "model_version_id": version.pk})
    assert 'data-testid="edge-lite"' in client.get(page).content.decode()
    _token, key = api_token_create(actor=owner, name="ci")
    response = client.get(
        f"/api/v1/teams/{team.slug}/models/{version.pk}/download/",
        {"target": "lite", "bundle": "edge"},
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content))) as tf:
        tf.extractall(tmp_path / "edge", filter="data")
    bundle = tmp_path / "edge" / "lite-edge"
    assert (bundle / "model" / "model.arm.nb").is_file()
    assert "Python 3.10" in (bundle / "README.md").read_text("utf-8")
    requirements = (bundle / "requirements.txt").read_text("utf-8").split()
    assert requirements == ["numpy==1.26.4", "paddlelite==2.13rc0"]

    venv = tmp_path / "venv"  # from the lite venv's base interpreter: a bare Python 3.10
    subprocess.run([str(lite.lite_python()), "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-r", str(bundle / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    checked = subprocess.run(
        [python, "-I", str(bundle / "predict.py"), "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    examples = len(version.evaluation["examples"])
    assert examples and f"{examples} of {examples} examples as expected" in checked.stdout
    frozen = subprocess.run(
        [python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout.lower()
    assert "paddlepaddle" not in frozen and "django" not in frozen
