"""The offline bundle (platform/offline): build a small one, install it with the network cut.

Needs what CI has: access to the package registry for the build (`build.py --subset` downloads
Django, Babel, pip and setuptools; the pip cache makes later runs fast), the project's
dependencies in this interpreter (collectstatic), and Linux. The install runs under
`unshare --net` (root), else with every proxy pointed at a dead port; install.sh itself gives
pip --no-index and no configuration but the bundle's. About 30 s.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "platform/offline/build.py"
VERSION = "0.1.0"
BUNDLE = f"model-platform-offline-{VERSION}"

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the bundle targets Linux"),
    pytest.mark.xdist_group("offline-bundle"),
]


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


def _offline(cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """cmd with no network: a network namespace of its own, else a dead proxy."""
    drop = {"PLATFORM_DATA_DIR", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHON"] = sys.executable
    if _can_unshare():
        return ["unshare", "--net", *cmd], env
    dead = "http://127.0.0.1:9"
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = dead
    env["no_proxy"] = env["NO_PROXY"] = ""
    return cmd, env


def _unpack(archive: Path, dest: Path) -> Path:
    dest.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / BUNDLE


def _install(bundle: Path, prefix: Path) -> subprocess.CompletedProcess:
    cmd, env = _offline([str(bundle / "install.sh"), "--prefix", str(prefix)])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("offline-build")
    env = {k: v for k, v in os.environ.items() if k != "PLATFORM_DATA_DIR"}
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--subset", "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = out / f"{BUNDLE}.tar.gz"
    assert path.is_file()
    # Only the archive remains: the staging directory is gone.
    assert [p.name for p in out.iterdir()] == [path.name]
    return path


def test_bundle_contents(archive, tmp_path):
    bundle = _unpack(archive, tmp_path / "x")
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert manifest["version"] == VERSION
    assert manifest["subset"] is True
    platform = manifest["venvs"]["platform"]
    assert platform["packages"]["django"].startswith("5.2.")
    assert platform["project_wheel"] == f"model_platform-{VERSION}-py3-none-any.whl"
    assert {"pip", "setuptools"} <= set(platform["tools"])
    # Every file is listed with its sha256, and every listed file is there.
    files = manifest["files"]
    listed = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    assert listed - set(files) == {"MANIFEST.json"}
    assert f"wheelhouse/platform/{platform['project_wheel']}" in files
    assert "platform/offline/install.sh" in files and "manage.py" in files
    assert not any(name.startswith("tests/") for name in files)
    assert not (bundle / "platform/__init__.py").exists()
    # collectstatic's output, with the manifest of the hashed names.
    assert "static/staticfiles.json" in files
    assert any(name.startswith("static/console/") for name in files)
    presets = manifest["presets"]
    assert presets["default"] in presets["presets"]
    assert "llama-tiny-char" in presets["presets"]
    assert presets["presets"]["bigru-crf-char"]["kind"] == "fast"
    pins = (bundle / "wheelhouse/platform/requirements.txt").read_text()
    assert f"django=={platform['packages']['django']}" in pins.splitlines()


def test_install_without_network(archive, tmp_path):
    bundle = _unpack(archive, tmp_path / "x")
    prefix = tmp_path / "opt"
    proc = _install(bundle, prefix)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "installed in" in proc.stdout

    django_admin = subprocess.run(
        [prefix / ".venv/bin/django-admin", "--version"], capture_output=True, text=True
    )
    assert django_admin.stdout.startswith("5.2."), django_admin.stderr
    # The project: installed, and imported from the prefix's source tree.
    probe = (
        "import importlib.metadata as m, runtime.presets as p;"
        "print(p.__file__);"
        "print(m.version('model-platform'));"
        "print(p.DEFAULT_PRESET)"
    )
    out = subprocess.run(
        [prefix / ".venv/bin/python", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [str(prefix / "runtime/presets.py"), VERSION, "ernie-tiny-char"]
    _check_runtime_distribution(bundle, prefix, tmp_path)
    assert (prefix / "locale/zh_Hans/LC_MESSAGES/django.mo").is_file()
    assert (prefix / "var/static/staticfiles.json").is_file()
    assert not (prefix / "wheelhouse").exists()

    # Idempotent: a second run changes nothing and succeeds.
    again = _install(bundle, prefix)
    assert again.returncode == 0, again.stdout + again.stderr


def _check_runtime_distribution(bundle: Path, prefix: Path, tmp_path: Path) -> None:
    """What the runtime venv installs from the bundle's tree (as install.sh does where the bundle
    has a runtime wheelhouse): runtime/ and serving/ with the backends' entry points, no app."""
    venv = tmp_path / "rt"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-index"]
    pip += ["--find-links", str(bundle / "wheelhouse/platform"), "--no-deps"]
    cmd, env = _offline([*pip, "-e", str(prefix / "platform/runtime-dist")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = (
        "import importlib.metadata as m, importlib.util as u, serving, runtime.presets as p;"
        "print(p.__file__);"
        "print(sorted(e.name for e in m.entry_points(group='model_platform.backends')));"
        "print([n for n in ('console', 'labeling', 'training', 'deployment') if u.find_spec(n)])"
    )
    out = subprocess.run(
        [venv / "bin/python", "-c", probe], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        str(prefix / "runtime/presets.py"),
        "['paddle', 'torch']",
        "[]",
    ]


def test_corrupt_file_is_named(archive, tmp_path):
    bundle = _unpack(archive, tmp_path / "x")
    wheel = next((bundle / "wheelhouse/platform").glob("django-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    prefix = tmp_path / "opt"

    proc = _install(bundle, prefix)
    assert proc.returncode != 0
    assert f"wheelhouse/platform/{wheel.name}: corrupt" in proc.stderr
    # Nothing was installed.
    assert not prefix.exists()
