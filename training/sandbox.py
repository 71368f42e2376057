"""What the platform's untrusted processes (the job runner, the serving host's predictor and
engine processes) are started with: an environment built from an allowlist (never the
platform's secrets, database or broker addresses, storage keys), and, where the platform runs
as root, an unprivileged user of their own (``PLATFORM_RUNNER_USER``) that can write only the
directory it was given and cannot read the platform's data directory.

No Django: the train worker (through ``training.services``) and the serving host (in the
runtime venv) both use it, so the two sandboxes are one definition.

The data directory stays traversable (``0711``: others may pass through, not list) because
the jobs' work directories and the serving host's staged models live under it by default;
every other entry at its top is made private to the platform's user (``secure_data_dir``),
which is checked again before each sandboxed process starts.
"""

import os
import pwd
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

# Variables a sandboxed process keeps from its parent's environment: what a Python process,
# its math libraries and the accelerators' runtimes need; nothing of the platform's own.
ALLOWED_ENV = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "KMP_AFFINITY",
        "KMP_BLOCKTIME",
        "TOKENIZERS_PARALLELISM",
        "USE_TORCH",
        "USE_TF",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
        # Device visibility (platform/hardware/*.toml).
        "CUDA_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
        "XPU_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "MLU_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_HOME",
        "CUDA_PATH",
        "ROCM_PATH",
        "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "NCCL_P2P_DISABLE",
        "GLOO_SOCKET_IFNAME",
        # Huawei's CANN toolkit (set_env.sh), Kunlunxin, Cambricon.
        "ASCEND_HOME_PATH",
        "ASCEND_TOOLKIT_HOME",
        "ASCEND_AICPU_PATH",
        "ASCEND_OPP_PATH",
        "ASCEND_GLOBAL_LOG_LEVEL",
        "TOOLCHAIN_HOME",
        "XPU_HOME",
        "NEUWARE_HOME",
    }
)
# Families of variables kept whole: Paddle's flags (FLAGS_*), the locale (LC_*), the
# accelerator libraries' own settings.
ALLOWED_ENV_PREFIXES = (
    "FLAGS_",
    "LC_",
    "HCCL_",
    "XCCL_",
    "BKCL_",
    "CNCL_",
    "MLU_",
    "XPU_",
    "VLLM_",
)
# Never kept from those families (nor passed as an extra): a name that carries a secret.
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|_KEY\b|^AWS_|DATABASE_URL|REDIS")
UMASK = 0o077


def sandbox_env(extra: dict[str, str] | None = None, *, home: Path | None = None) -> dict[str, str]:
    """The environment of a sandboxed process: the allowlisted variables of this one's, then
    ``extra`` (what the caller decides: PYTHONPATH, the device's visibility…). ``home`` (a
    directory the process may write) is its HOME and TMPDIR: caches (Paddle's, Hugging Face's)
    go there, not to the platform user's home."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name in ALLOWED_ENV
        or (name.startswith(ALLOWED_ENV_PREFIXES) and not SECRET_NAME.search(name))
    }
    env.setdefault("PATH", os.defpath)
    if home is not None:
        env["HOME"] = str(home)
        env["TMPDIR"] = str(home)
        env["XDG_CACHE_HOME"] = str(home / ".cache")
    for name, value in (extra or {}).items():
        if SECRET_NAME.search(name) and name not in ALLOWED_ENV:
            raise ValueError(f"{name} is not passed to a sandboxed process: it names a secret")
        env[name] = value
    return env


@dataclass(frozen=True)
class RunnerUser:
    """Whom a sandboxed process runs as: ``switch`` is False where the platform is not root
    (it runs as the platform's own user, with the scrubbed environment only)."""

    name: str
    uid: int
    gid: int
    switch: bool

    def popen_kwargs(self) -> dict:
        """What subprocess.Popen needs to start the process as this user, with no supplementary
        group of the platform's and a private umask."""
        if not self.switch:
            return {"umask": UMASK}
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": UMASK}


DEFAULT_RUNNER_USERS = ("model-platform-runner", "nobody")


def runner_user(name: str = "") -> RunnerUser:
    """The user sandboxed processes run as. ``name`` (PLATFORM_RUNNER_USER) names it; empty:
    ``model-platform-runner`` if the machine has it, else ``nobody``. Only root switches;
    anyone else runs them as itself."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return RunnerUser(me.pw_name, me.pw_uid, os.getegid(), switch=False)
    names = (name,) if name else DEFAULT_RUNNER_USERS
    for candidate in names:
        try:
            entry = pwd.getpwnam(candidate)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            raise ValueError(f"PLATFORM_RUNNER_USER={candidate} is root: name an unprivileged user")
        return RunnerUser(entry.pw_name, entry.pw_uid, entry.pw_gid, switch=True)
    raise ValueError(
        f"PLATFORM_RUNNER_USER: no user {' or '.join(names)} on this machine; create one "
        "(useradd --system --no-create-home model-platform-runner) or name another"
    )


def give_to(user: RunnerUser, directory: Path) -> None:
    """``directory`` and everything in it becomes the user's (mode 0700 at the top): the one
    place the sandboxed process writes. Links are not followed."""
    if not user.switch:
        return
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), user.uid, user.gid)
    os.lchown(directory, user.uid, user.gid)
    os.chmod(directory, 0o700)


def take_back(user: RunnerUser, directory: Path) -> None:
    """A sandboxed process has ended: its directory is the platform's again (0700), closed to
    the runner's user, whose later processes (other teams' jobs) must not read what it left
    (a failed job's data and checkpoint wait there for a retry, which gives it back)."""
    if not user.switch or not directory.exists():
        return
    uid, gid = os.geteuid(), os.getegid()
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), uid, gid)
    os.lchown(directory, uid, gid)
    os.chmod(directory, 0o700)


def make_traversable(directory: Path, *, stop: Path | None = None) -> None:
    """``directory`` and its parents (up to ``stop``, or the root) let others pass through
    (o+x, not listing): the sandboxed user reaches its own directory under them."""
    directory = directory.resolve()
    stop = stop.resolve() if stop else None
    for path in [directory, *directory.parents]:
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(path, stat.S_IMODE(mode) | stat.S_IXOTH)
        if path == stop:
            return


PASSAGE = 0o711  # others may pass through to a known name, not list nor write


def make_passage(*directories: Path) -> None:
    """The directories on the way to a sandboxed process's own: passable, not listable."""
    for directory in directories:
        os.chmod(directory, PASSAGE)


def secure_data_dir(user: RunnerUser, data_dir: Path, keep: list[Path]) -> None:
    """The data directory (secret key, SQLite database, storage, uploads) is the platform's
    alone: passable, not listable (0711), every entry at its top closed to others (and to the
    sandbox's group), but those on the way to ``keep`` (the jobs' work directories), which
    stay passable, not listable. The platform's group keeps its rights: the web and
    Celery workers are of it where the train worker runs as root. Run as root before each
    sandboxed process starts."""
    data_dir = data_dir.resolve()
    if not data_dir.is_dir():
        return
    ways = set()
    for path in keep:
        path = path.resolve()
        if path.is_relative_to(data_dir) and path != data_dir:
            ways.add(path.relative_to(data_dir).parts[0])

    def closed(st: os.stat_result) -> int:
        mode = stat.S_IMODE(st.st_mode)
        return mode & (0o700 if st.st_gid == user.gid else 0o770)

    top = data_dir.stat()
    os.chmod(data_dir, closed(top) | PASSAGE if ways else closed(top))
    for entry in os.scandir(data_dir):
        if entry.name in ways or entry.is_symlink():
            continue
        st = entry.stat(follow_symlinks=False)
        if stat.S_IMODE(st.st_mode) != closed(st):
            os.chmod(entry.path, closed(st))
    for path in keep:
        path.mkdir(parents=True, exist_ok=True)
        path = path.resolve()
        if not path.is_relative_to(data_dir):
            continue  # elsewhere: the site's to open (check_reachable says so)
        # Each directory on the way: passable to a known name, not listable.
        for way in [path, *path.parents]:
            if way == data_dir:
                break
            os.chmod(way, closed(way.stat()) | PASSAGE)


def check_outputs(user: RunnerUser, paths: list[Path]) -> None:
    """What a sandboxed process left for the platform to read (as root) holds only regular
    files and directories: a link (symbolic or hard) would make the platform copy what the
    process itself cannot read, such as the secret key."""
    if not user.switch:
        return
    for top in paths:
        if not top.exists() and not top.is_symlink():
            continue
        items = [top]
        if top.is_dir() and not top.is_symlink():
            items += [Path(root) / n for root, dirs, files in os.walk(top) for n in dirs + files]
        for item in items:
            st = item.lstat()
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise PermissionError(f"{item} is not a regular file or directory: refused")
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise PermissionError(f"{item} is a hard link to another file: refused")


def stage_readable(user: RunnerUser, source: Path, target: Path) -> Path:
    """A copy of ``source`` (a model's directory) at ``target`` that the user can read
    (hard links where the files already are readable by others and on the same disk, else
    copies): the user needs no access to where the platform keeps it. The user's own
    ``target`` if it switches; ``source`` itself if not."""
    if not user.switch:
        return source
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)

    def copy(src: str, dst: str) -> None:
        if os.stat(src).st_mode & stat.S_IROTH:
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)

    shutil.copytree(source, target / source.name, copy_function=copy, dirs_exist_ok=True)
    for root, dirs, files in os.walk(target):
        for name in dirs:
            os.chown(os.path.join(root, name), user.uid, user.gid)
            os.chmod(os.path.join(root, name), 0o700)
        for name in files:
            path = os.path.join(root, name)
            if os.stat(path).st_nlink == 1:
                os.chown(path, user.uid, user.gid)
    os.chown(target, user.uid, user.gid)
    os.chmod(target, 0o700)
    return target / source.name


def check_reachable(user: RunnerUser, path: Path, what: str) -> None:
    """Raise PermissionError, naming the directory, if the user cannot reach and read ``path``
    (the runtime's interpreter, the platform's code): a clear error instead of a runner that
    dies at once with "Permission denied"."""
    if not user.switch:
        return
    target = Path(os.path.realpath(path))
    for item in [*reversed(target.parents), target]:
        st = item.stat()
        if st.st_uid == user.uid:
            bits = stat.S_IRUSR | stat.S_IXUSR
        elif st.st_gid == user.gid:
            bits = stat.S_IRGRP | stat.S_IXGRP
        else:
            bits = stat.S_IROTH | stat.S_IXOTH
        needed = bits if item == target else bits & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        if item == target and not stat.S_ISDIR(st.st_mode):
            needed = bits & (stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        if st.st_mode & needed != needed:
            raise PermissionError(
                f"PLATFORM_RUNNER_USER {user.name} cannot reach {what} {path}: {item} is "
                f"{stat.filemode(st.st_mode)} ({st.st_uid}:{st.st_gid}). Make it readable "
                f"by that user (e.g. chmod o+x {item}), or install it where it is."
            )
