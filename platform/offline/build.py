#!/usr/bin/env python3
"""Build the offline bundle (`make offline-bundle`): one archive that installs the whole platform
on an air-gapped machine with `platform/offline/install.sh`, without any network.

Runs on a machine with registry access, with a CPython 3.11 on linux x86_64 (the target's
interpreter: wheels are resolved and built for it). Standard library only.

    python platform/offline/build.py --output dist/
    python platform/offline/build.py --subset --output /tmp/b.tar.gz   # Django + Babel only

The archive holds one directory, model-platform-offline-<version>/:

    manage.py, console/ … platform/   the source tree needed to run (no tests)
    wheelhouse/platform/              the console's dependencies, the project's own wheel, pip
                                      and the build backend of the editable install
    wheelhouse/runtime/               platform/requirements/runtime.txt (Paddle, torch …)
    wheelhouse/labelstudio/           label-studio and its dependencies
    wheelhouse/*/requirements.txt     the exact pins of each wheelhouse (what install.sh installs)
    static/                           collectstatic's output (STATIC_ROOT)
    install.sh                        runs platform/offline/install.sh
    MANIFEST.json                     versions, presets, the sha256 of every file
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[2]
NAME = "model-platform"
TARGET = {"python": (3, 11), "platform": "linux-x86_64"}
# Not needed to run the platform on a site.
EXCLUDED_DIRS = ("tests/", "benchmarks/", ".ci/")
# --subset: the console's requirements of a small test bundle (specifiers from pyproject.toml).
SUBSET = ("django", "babel")
VENVS = ("platform", "runtime", "labelstudio")
# The oldest glibc of the target machines (RHEL/Rocky 8 have 2.28); the torch and onnxruntime
# wheels need 2.28 anyway.
DEFAULT_GLIBC = "2.28"
# The legacy manylinux tags and their glibc (PEP 600).
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
# Wheels are compressed already: a higher level costs minutes for a few percent.
GZIP_LEVEL = 1


def log(message: str) -> None:
    print(f"[offline-bundle] {message}", flush=True)


def fail(message: str) -> NoReturn:
    sys.exit(f"offline-bundle: error: {message}")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    if not match:
        fail(f"cannot read the requirement {spec!r}")
    return canonical(match.group(1))


def wheel_name_version(path: Path) -> tuple[str, str]:
    # name-version(-build)?-python-abi-platform.whl
    parts = path.name[: -len(".whl")].split("-")
    return canonical(parts[0]), parts[1]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, check=True, **kwargs)
    except subprocess.CalledProcessError as exc:
        fail(f"command failed ({exc.returncode}): {' '.join(cmd)}")


def check_interpreter(python: str) -> str:
    """The interpreter that resolves the wheels must be the target's: CPython 3.11, linux-x86_64."""
    probe = (
        "import sys, sysconfig, platform;"
        "print(sys.implementation.name, '%d.%d' % sys.version_info[:2], sysconfig.get_platform(),"
        " platform.python_version())"
    )
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True)
    impl, version, plat, full = out.stdout.split()
    wanted = "{}.{}".format(*TARGET["python"])
    if impl != "cpython" or version != wanted or plat != TARGET["platform"]:
        fail(
            f"{python} is {impl} {version} on {plat}; the bundle is for CPython {wanted} on "
            f"{TARGET['platform']}: build it on such a machine (--python to choose the interpreter)"
        )
    return full


def git(*args: str) -> str:
    executable = shutil.which("git")
    if executable is None:
        fail("git not found: the bundle is built from a git checkout")
    return subprocess.run(
        [executable, "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout


def source_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files of the working tree, minus tests."""
    try:
        out = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    except subprocess.CalledProcessError:
        fail(f"{REPO} is not a git checkout: build the bundle from one")
    return sorted(
        name
        for name in set(out.split("\0"))
        if name
        and not name.startswith(EXCLUDED_DIRS)
        and ((REPO / name).is_file() or (REPO / name).is_symlink())
    )


def git_revision() -> dict:
    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "dirty": bool(git("status", "--porcelain").strip()),
    }


def label_studio_requirement() -> str:
    """The Label Studio pin of the Makefile (its `labelstudio` target), the one source of it."""
    match = re.search(r"label-studio==([\w.]+)", (REPO / "Makefile").read_text())
    if not match:
        fail("no label-studio==VERSION in the Makefile")
    return f"label-studio=={match.group(1)}"


def read_presets() -> dict:
    """The training presets, read from runtime/presets.py without importing it."""
    tree = ast.parse((REPO / "runtime/presets.py").read_text())
    values: dict[str, object] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                values[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    presets = {}
    for group, kind in (
        ("FAST_PRESETS", "fast"),
        ("PRESETS", "encoder"),
        ("LLM_PRESETS", "causal-lm"),
    ):
        for name, config in dict(values.get(group) or {}).items():
            presets[name] = {"kind": kind, "config": config}
    return {
        "source": "runtime/presets.py",
        "note": "built from a config at training time; no weight files",
        # On an accelerator; a CPU trains the task kind's fast preset.
        "default": values.get("DEFAULT_PRESET"),
        "default_llm": values.get("DEFAULT_LLM_PRESET"),
        "presets": presets,
    }


class Builder:
    def __init__(self, args: argparse.Namespace, root: Path, work: Path) -> None:
        self.args = args
        self.root = root
        self.work = work
        self.python = args.python
        self.pip_args = [*(["--quiet"] if not args.verbose else []), *args.pip_arg]
        # PEP 600: pip asks a `_manylinux` module whether a glibc is acceptable, so wheels are
        # chosen for the target's glibc, not for the (newer) one of the build machine.
        hook = work / "manylinux-hook"
        hook.mkdir()
        major, minor = args.glibc
        (hook / "_manylinux.py").write_text(
            "def manylinux_compatible(major, minor, arch):\n"
            f"    return (major, minor) <= ({major}, {minor})\n"
        )
        pythonpath = [str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.pip_env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}

    def pip_wheel(self, dest: Path, *specs: str) -> None:
        cmd = [self.python, "-m", "pip", "wheel", "--disable-pip-version-check"]
        run([*cmd, *self.pip_args, "--wheel-dir", str(dest), *specs], env=self.pip_env)

    def copy_source(self) -> int:
        files = source_files()
        for name in files:
            dest = self.root / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            # Links stay links (platform/runtime-dist links runtime/ and serving/).
            shutil.copy2(REPO / name, dest, follow_symlinks=False)
        # The bundle's entry point, beside MANIFEST.json.
        launcher = self.root / "install.sh"
        launcher.write_text(
            '#!/usr/bin/env bash\nexec "$(dirname "$0")/platform/offline/install.sh" "$@"\n'
        )
        launcher.chmod(0o755)
        return len(files)

    def requirements_file(self, name: str, specs: list[str]) -> Path:
        path = self.work / f"{name}.in"
        path.write_text("".join(f"{spec}\n" for spec in specs))
        return path

    def wheelhouse(self, name: str, specs: list[str], *, tools: tuple[str, ...] = ()) -> dict:
        """Wheels of specs and all their dependencies (sdists built into wheels), pinned."""
        dest = self.root / "wheelhouse" / name
        dest.mkdir(parents=True, exist_ok=True)
        log(f"wheelhouse/{name}: {len(specs)} requirement(s)")
        self.pip_wheel(dest, "-r", str(self.requirements_file(name, specs)))
        packages = dict(sorted(wheel_name_version(whl) for whl in dest.glob("*.whl")))
        if len(packages) != len(list(dest.glob("*.whl"))):
            fail(f"wheelhouse/{name} holds two versions of one package")
        # The pins install.sh installs: exactly this wheelhouse, nothing resolved on the site.
        (dest / "requirements.txt").write_text(
            f"# Pinned by platform/offline/build.py: every wheel of wheelhouse/{name}.\n"
            + "".join(f"{pkg}=={version}\n" for pkg, version in packages.items())
        )
        if tools:
            # Installer tools (pip, the build backend), beside the pins rather than in them.
            self.pip_wheel(dest, *tools)
        return {
            "dir": f"wheelhouse/{name}",
            "requirements": specs,
            "packages": packages,
            "tools": dict(
                wheel_name_version(whl)
                for whl in dest.glob("*.whl")
                if wheel_name_version(whl)[0] not in packages
            ),
        }

    def project_wheel(self) -> str:
        """The project's own wheel, built from the bundled source tree."""
        dest = self.root / "wheelhouse" / "platform"
        before = set(dest.glob("*.whl"))
        self.pip_wheel(dest, "--no-deps", str(self.root))
        for leftover in ("build", "model_platform.egg-info"):
            shutil.rmtree(self.root / leftover, ignore_errors=True)
        built = sorted(set(dest.glob("*.whl")) - before)
        if len(built) != 1:
            fail("building the project's wheel gave no single wheel")
        return built[0].name

    def collect_static(self) -> int:
        """collectstatic of the bundled tree into static/, as start.sh runs it (DEBUG off)."""
        data = self.work / "data"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "PLATFORM_DATA_DIR": str(data),
            "SECRET_KEY": secrets.token_urlsafe(50),
            "DEBUG": "",
            "STORAGE_BACKEND": "filesystem",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        log("static/: collectstatic")
        cmd = [self.python, str(self.root / "manage.py"), "collectstatic", "--noinput", "-v0"]
        try:
            subprocess.run(cmd, check=True, cwd=self.root, env=env)
        except subprocess.CalledProcessError:
            fail(
                f"collectstatic failed: {self.python} needs the project's dependencies "
                "(make install), or pass --no-static"
            )
        shutil.move(data / "static", self.root / "static")
        return sum(1 for p in (self.root / "static").rglob("*") if p.is_file())


def dedupe(root: Path) -> int:
    """Hard-link identical wheels of several wheelhouses: the archive stores them once."""
    seen: dict[tuple[str, str], Path] = {}
    saved = 0
    for whl in sorted((root / "wheelhouse").glob("*/*.whl")):
        key = (whl.name, sha256(whl))
        if key in seen:
            whl.unlink()
            os.link(seen[key], whl)
            saved += whl.stat().st_size
        else:
            seen[key] = whl
    return saved


def wheel_glibc(name: str) -> tuple[int, int] | None:
    """The oldest glibc a wheel runs on (its most permissive manylinux tag), None if pure."""
    platforms = name[: -len(".whl")].split("-")[-1].split(".")
    versions = []
    for tag in platforms:
        match = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag)
        if match:
            versions.append((int(match.group(1)), int(match.group(2))))
        elif tag.split("_", 1)[0] in LEGACY_MANYLINUX:
            versions.append(LEGACY_MANYLINUX[tag.split("_", 1)[0]])
    return min(versions) if versions else None


def glibc_report(root: Path) -> dict:
    """The glibc the bundle needs, and the wheels built here from sdists (this glibc's)."""
    wheels = sorted({whl.name for whl in (root / "wheelhouse").glob("*/*.whl")})
    needed = [v for v in map(wheel_glibc, wheels) if v]
    local = [name for name in wheels if name.endswith("-linux_x86_64.whl")]
    return {
        "min_glibc": "{}.{}".format(*max(needed)) if needed else None,
        "built_from_source": local,
    }


def file_table(root: Path) -> dict[str, dict]:
    table = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            rel = path.relative_to(root).as_posix()
            table[rel] = {"sha256": sha256(path), "size": path.stat().st_size}
    return table


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return str(size)


def pack(root: Path, archive: Path) -> None:
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    partial = archive.with_name(archive.name + ".part")
    with tarfile.open(partial, "w:gz", compresslevel=GZIP_LEVEL) as tar:
        tar.add(root, arcname=root.name, filter=normalise)
    partial.replace(archive)


def glibc_version(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a glibc version such as 2.28")
    return int(match.group(1)), int(match.group(2))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output",
        required=True,
        type=Path,
        help="a directory (the archive is written into it) or the archive's path (.tar.gz)",
    )
    small = parser.add_mutually_exclusive_group()
    small.add_argument(
        "--subset",
        action="store_true",
        help="a small test bundle: the console's Django and Babel only, no runtime or Label "
        "Studio wheelhouse; the project is installed without its dependencies",
    )
    small.add_argument(
        "--requirements",
        type=Path,
        help="like --subset, with this requirements file as the console's wheelhouse",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the CPython 3.11 that resolves the wheels and runs collectstatic (default: this one)",
    )
    parser.add_argument(
        "--glibc",
        default=DEFAULT_GLIBC,
        type=glibc_version,
        help=f"the oldest glibc of the target machines (default {DEFAULT_GLIBC}): no wheel "
        "needs a newer one",
    )
    parser.add_argument("--no-static", action="store_true", help="leave collectstatic out")
    parser.add_argument(
        "--pip-arg",
        action="append",
        default=[],
        help="an extra argument of every `pip wheel`, e.g. "
        "--pip-arg=--extra-index-url=https://download.pytorch.org/whl/cpu (repeatable)",
    )
    parser.add_argument("--verbose", action="store_true", help="pip's own output")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    python_version = check_interpreter(args.python)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    version = pyproject["project"]["version"]
    dependencies: list[str] = pyproject["project"]["dependencies"]
    build_requires: list[str] = pyproject["build-system"]["requires"]

    bundle_name = f"{NAME}-offline-{version}"
    output = args.output.resolve()
    if output.name.endswith(".tar.gz"):
        archive = output
    else:
        archive = output / f"{bundle_name}.tar.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)

    subset = bool(args.subset or args.requirements)
    if args.requirements:
        platform_specs = [
            line.split("#", 1)[0].strip()
            for line in args.requirements.read_text().splitlines()
            if line.split("#", 1)[0].strip()
        ]
    elif args.subset:
        platform_specs = [spec for spec in dependencies if requirement_name(spec) in SUBSET]
    else:
        platform_specs = list(dependencies)

    # Staged beside the archive: same file system, and no 2 GB in /tmp.
    stage = Path(tempfile.mkdtemp(prefix=".offline-build-", dir=archive.parent))
    try:
        root = stage / bundle_name
        root.mkdir()
        builder = Builder(args, root, stage)
        log(f"source tree of {REPO}")
        n_source = builder.copy_source()
        venvs = {
            "platform": builder.wheelhouse(
                "platform", platform_specs, tools=("pip", *build_requires)
            )
        }
        venvs["platform"]["project_wheel"] = builder.project_wheel()
        if not subset:
            runtime_txt = (REPO / "platform/requirements/runtime.txt").read_text()
            runtime_specs = [
                line.split("#", 1)[0].strip()
                for line in runtime_txt.splitlines()
                if line.split("#", 1)[0].strip()
            ]
            venvs["runtime"] = builder.wheelhouse("runtime", runtime_specs)
            venvs["labelstudio"] = builder.wheelhouse("labelstudio", [label_studio_requirement()])
        saved = dedupe(root)
        n_static = 0 if args.no_static else builder.collect_static()

        log("MANIFEST.json: sha256 of every file")
        files = file_table(root)
        manifest = {
            "name": NAME,
            "version": version,
            "bundle": bundle_name,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git": git_revision(),
            "subset": subset,
            "target": {
                "python": "{}.{}".format(*TARGET["python"]),
                "built_with_python": python_version,
                "platform": TARGET["platform"],
                "glibc_cap": "{}.{}".format(*args.glibc),
                **glibc_report(root),
            },
            "venvs": venvs,
            "static": {"dir": "static", "files": n_static} if n_static else None,
            "presets": read_presets(),
            "size": sum(entry["size"] for entry in files.values()),
            "files": files,
        }
        (root / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))

        log(f"packing {archive.name}")
        pack(root, archive)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    for name, venv in venvs.items():
        size = sum(files[f"{venv['dir']}/{whl}"]["size"] for whl in _wheels(files, venv["dir"]))
        log(f"  wheelhouse/{name}: {len(venv['packages'])} packages, {human(size)}")
    log(f"  source: {n_source} files; static: {n_static} files; hard-linked: {human(saved)}")
    log(f"{archive} ({human(archive.stat().st_size)}) in {time.monotonic() - started:.0f} s")
    return 0


def _wheels(files: dict[str, dict], directory: str) -> list[str]:
    prefix = directory + "/"
    return [
        path[len(prefix) :]
        for path in files
        if path.startswith(prefix) and path.endswith(".whl") and "/" not in path[len(prefix) :]
    ]


if __name__ == "__main__":
    sys.exit(main())
