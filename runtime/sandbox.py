"""What the platform's untrusted processes (the job runner, the serving host's predictor and
engine processes) are started with: an environment built from an allowlist (never the
platform's secrets, database or broker addresses, storage keys), and, where the platform runs
as root, an unprivileged uid that can write only the directory it was given and cannot read the
platform's data directory: one of each job attempt's and each loaded revision's own
(``PLATFORM_RUNNER_UID_BASE`` + a slot, in ``PLATFORM_RUNNER_USER``'s group), so that one job
cannot read or signal another's processes or files, and every process of it is killed when it
ends; with no base, ``PLATFORM_RUNNER_USER`` itself, shared by all (weaker).

No Django: the train worker (through ``training.launch`` and ``training.supervision``) and the
serving host (in the runtime venv) both use it, so the two sandboxes are one definition.

The data directory stays traversable (``0711``: others may pass through, not list) because
the jobs' work directories and the serving host's staged models live under it by default;
every other entry at its top is made private to the platform's user (``secure_data_dir``),
which is checked again before each sandboxed process starts.
"""

import hashlib
import os
import pwd
import re
import shutil
import signal
import stat
import threading
import time
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
        # Export targets (runtime.targets) and the lite venv's interpreter (runtime.lite).
        "PLATFORM_EXPORT_TARGETS",
        "LITE_PYTHON",
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
SECRET_NAME = re.compile(
    r"SECRET|PASSW|PASSPHRASE|TOKEN|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|"
    r"(^|_)(PASS|PWD|AUTH\w*|KEYS?|DSN|COOKIE|SESSION|SIGNATURE|CERT)(_|$)|"
    r"^AWS_|DATABASE_URL|BROKER|REDIS",
    re.IGNORECASE,
)
# Forced in every sandboxed process: no model or data set is fetched from the network.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
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
    env.update(OFFLINE_ENV)
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
    (it runs as the platform's own user, with the scrubbed environment only). ``own``: the uid
    is this job's (or revision's) alone, so every process of it may be killed when it ends."""

    name: str
    uid: int
    gid: int
    switch: bool
    own: bool = False

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
    entry = _shared(name)
    return RunnerUser(entry.pw_name, entry.pw_uid, entry.pw_gid, switch=True)


# Where PLATFORM_RUNNER_UID_BASE is set, each job attempt and each loaded revision runs as a
# uid of its own, base + a slot (no passwd entry needed): jobs in the first JOB_SLOTS (16
# attempts per job), predictors in the PREDICTOR_SLOTS after them.
ATTEMPT_SLOTS = 16
JOB_SLOTS = 1 << 24
PREDICTOR_SLOTS = 1 << 20
# PLATFORM_RUNNER_UID_BASE unless set (the platform's settings and the serving host read it).
DEFAULT_UID_BASE = 200000


def _shared(name: str) -> pwd.struct_passwd:
    names = (name,) if name else DEFAULT_RUNNER_USERS
    for candidate in names:
        try:
            entry = pwd.getpwnam(candidate)
        except KeyError:
            continue
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise ValueError(f"PLATFORM_RUNNER_USER={candidate} is root: name an unprivileged user")
        return entry
    raise ValueError(
        f"PLATFORM_RUNNER_USER: no user {' or '.join(names)} on this machine; create one "
        "(useradd --system --no-create-home model-platform-runner) or name another"
    )


def _own_uid(name: str, uid_base: int, slot: int) -> RunnerUser:
    entry = _shared(name)
    uid = uid_base + slot
    if uid_base <= 0 or uid >= 2**31 - 1:
        raise ValueError(f"PLATFORM_RUNNER_UID_BASE={uid_base}: uid {uid} is out of range")
    try:
        holder = pwd.getpwuid(uid)
    except KeyError:
        holder = None
    if holder is not None:
        raise ValueError(
            f"PLATFORM_RUNNER_UID_BASE={uid_base}: uid {uid} is the user {holder.pw_name}'s; "
            f"choose a base whose {JOB_SLOTS + PREDICTOR_SLOTS} uids no user of the machine has"
        )
    return RunnerUser(f"uid {uid}", uid, entry.pw_gid, switch=True, own=True)


def job_user(name: str, uid_base: int, job_id: int, attempt: int) -> RunnerUser:
    """Whom an attempt of a job runs as: with ``uid_base`` (PLATFORM_RUNNER_UID_BASE) a uid of
    its own, in the group of PLATFORM_RUNNER_USER; without, that user itself (every job
    shares it)."""
    if os.geteuid() != 0 or uid_base <= 0:
        return runner_user(name)
    slot = (job_id % (JOB_SLOTS // ATTEMPT_SLOTS)) * ATTEMPT_SLOTS + attempt % ATTEMPT_SLOTS
    return _own_uid(name, uid_base, slot)


def job_uids(uid_base: int, job_id: int) -> set[int]:
    """Every uid the attempts of a job may have run as (where each has its own)."""
    first = uid_base + (job_id % (JOB_SLOTS // ATTEMPT_SLOTS)) * ATTEMPT_SLOTS
    return set(range(first, first + ATTEMPT_SLOTS)) if uid_base > 0 else set()


_claimed: set[int] = set()
_claimed_lock = threading.Lock()


def claim_user(name: str, uid_base: int, key: str) -> RunnerUser:
    """A uid for a revision loaded on the serving host (its predictors or engine): derived from
    ``key``, the next free one (no process of it, not claimed by this host) if taken. Give it
    back with ``release_user`` once its processes are stopped."""
    if os.geteuid() != 0 or uid_base <= 0:
        return runner_user(name)
    start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    with _claimed_lock:
        for i in range(PREDICTOR_SLOTS):
            user = _own_uid(name, uid_base, JOB_SLOTS + (start + i) % PREDICTOR_SLOTS)
            if user.uid not in _claimed and not processes_of({user.uid}):
                _claimed.add(user.uid)
                return user
    raise RuntimeError("no free uid for a predictor: PLATFORM_RUNNER_UID_BASE's range is used up")


def release_user(user: RunnerUser) -> None:
    """A revision's processes are gone: every process left of its uid is killed, and the uid
    may be claimed again."""
    if user.own:
        kill_processes(user)
        with _claimed_lock:
            _claimed.discard(user.uid)


def processes_of(uids: set[int]) -> list[int]:
    """The live processes (not zombies) of which a real, effective, saved or file-system uid is
    one of ``uids``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                status = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        held = {int(u) for u in fields.get("Uid", "").split()}
        if held & uids and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry.name))
    return found


def kill_processes(user: RunnerUser, *, also: set[int] | None = None, wait_s: float = 10) -> None:
    """Kill every process of the user's own uid (and of the uids ``also``): what a runner left
    behind (daemonised by setsid, out of reach of the parent-death signal and of the process
    group's kill) must not outlive its job. Nothing where the uid is shared (another job's)."""
    if not user.own:
        return
    uids = {user.uid, *(also or ())}
    deadline = time.monotonic() + wait_s
    while (pids := processes_of(uids)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def give_to(user: RunnerUser, directory: Path) -> None:
    """``directory`` and everything in it becomes the user's (mode 0700 at the top): the one
    place the sandboxed process writes. The top is closed (root's, 0700) while the rest is
    walked by file descriptor, links never followed, and given last; a file with other hard
    links is not given away."""
    if not user.switch:
        return
    if directory.is_symlink():
        raise PermissionError(f"{directory} is a symbolic link: refused")
    if os.lstat(directory).st_uid != user.uid:
        # Not the user's yet: closed while walked. (Already its own, as when a job's part on
        # another node starts while the first node's runner works in it: left open.)
        os.chown(directory, os.geteuid(), os.getegid(), follow_symlinks=False)
        os.chmod(directory, 0o700)
    for _root, dirs, files, fd in os.fwalk(directory, follow_symlinks=False):
        for name in [*dirs, *files]:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                continue
            os.chown(name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
    os.chown(directory, user.uid, user.gid, follow_symlinks=False)


def take_back(user: RunnerUser, directory: Path, *, also: set[int] | None = None) -> None:
    """A sandboxed process has ended: every process left of its uid is killed (and of the uids
    ``also``), then its directory is the platform's again, every entry of it root's and closed
    to others (links not followed): no later runner (another team's job, where the user is
    shared) reads what it left (a failed job's data and checkpoint wait there for a retry,
    which gives it back), and no entry it opened to everyone stays writable."""
    if not user.switch:
        return
    kill_processes(user, also=also)
    if not os.path.lexists(directory):
        return
    if directory.is_symlink():
        raise PermissionError(f"{directory} is a symbolic link: refused")
    uid, gid = os.geteuid(), os.getegid()
    os.chown(directory, uid, gid, follow_symlinks=False)
    os.chmod(directory, 0o700)
    for _root, dirs, files, fd in os.fwalk(directory, follow_symlinks=False):
        for name in [*dirs, *files]:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(name, stat.S_IMODE(st.st_mode) & 0o700, dir_fd=fd)


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


def _not_plain(top: Path):
    """(entry, why) for each entry of ``top`` (itself included) that is neither a directory nor
    a regular file of one link. Links are not followed."""
    if not os.path.lexists(top):
        return
    items = [top]
    if top.is_dir() and not top.is_symlink():
        items += [Path(root) / n for root, dirs, files in os.walk(top) for n in dirs + files]
    for item in items:
        st = item.lstat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            yield item, "is not a regular file or directory"
        elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            yield item, "is a hard link to another file"


def plain(top: Path) -> bool:
    """Whether ``top`` holds only directories and regular files of one link."""
    return next(_not_plain(top), None) is None


def check_outputs(user: RunnerUser, paths: list[Path]) -> None:
    """What a sandboxed process left for the platform to read (as root) holds only regular
    files and directories: a link (symbolic or hard) would make the platform copy what the
    process itself cannot read, such as the secret key. Run after ``take_back``: no process
    of the user is left to swap an entry once checked."""
    if not user.switch:
        return
    for top in paths:
        for item, why in _not_plain(top):
            raise PermissionError(f"{item} {why}: refused")


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

    shutil.copytree(
        source, target / source.name, symlinks=True, copy_function=copy, dirs_exist_ok=True
    )
    os.chmod(target, 0o700)
    for _root, dirs, files, fd in os.fwalk(target, follow_symlinks=False):
        for name in dirs:
            os.chown(name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
            os.chmod(name, 0o700, dir_fd=fd)
        for name in files:
            if os.stat(name, dir_fd=fd, follow_symlinks=False).st_nlink == 1:
                os.chown(name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
    os.chown(target, user.uid, user.gid, follow_symlinks=False)
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
