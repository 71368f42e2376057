"""How the train worker starts the runner (``runtime/run.py``, in the runtime venv): its command
(alone, or one process per device under Paddle's or torch's launcher, on one node or several),
its environment (the sandbox's allowlist, the device's visibility), the user it runs as, and
the arguments of its process."""

import ctypes
import os
import signal
from pathlib import Path
from typing import Any

from django.conf import settings

from console.hardware import profile
from console.models import Node
from runtime import sandbox
from training.models import TrainingJob


def runner_device(job: TrainingJob) -> str:
    """The framework's device string for the job: its profile's, or the CPU on a simulated
    node (devices declared by PLATFORM_DEVICES)."""
    if Node.objects.filter(name=job.node, simulated=True).exists():
        return "cpu"
    return profile(job.device_type).paddle_device


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


def die_with_parent() -> None:
    # The runner dies with the task's process: a worker killed mid-job leaves no orphan
    # holding the device (PR_SET_PDEATHSIG).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
