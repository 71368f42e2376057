"""The runner and the predictor processes hold no secrets and, where the platform runs as root
(CI does), run as PLATFORM_RUNNER_USER: write only their own directory, read nothing of the data
directory. A chat template cannot keep a process busy for ever."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.core.exceptions import ValidationError

from runtime import sandbox
from runtime.chat import ChatTokenizer
from runtime.chat_template import ChatTemplateError
from tests.helpers.data import make_jsonl_version, rows_for
from tests.helpers.jobs import wait_for
from tests.helpers.serving import KEY, load, route
from training.base_models import inspect_model_dir
from training.jobs import training_job_cancel, training_job_submit
from training.launch import runner_popen_args, runner_sandbox
from training.supervision import _prepare_workdir, job_workdir, training_job_part_execute

ROOT = os.geteuid() == 0
# What the platform's processes hold that no sandboxed process may: names and values.
SECRET_NAMES = (
    "SECRET_KEY",
    "SERVING_SECRET",
    "DATABASE_URL",
    "REDIS_URL",
    "AWS_SECRET_ACCESS_KEY",
)


def secrets_of_this_process() -> dict[str, str]:
    return {n: os.environ[n] for n in SECRET_NAMES if os.environ.get(n)}


def assert_no_secrets(environ: dict[str, str], secrets: dict[str, str]) -> None:
    assert secrets, "the test runs with no secret in its environment to leak"
    leaked = sorted(set(secrets) & set(environ))
    assert not leaked, f"the sandboxed process holds {leaked}"
    text = "\n".join(environ.values())
    assert not [n for n, v in secrets.items() if v in text], "a secret's value leaked"


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def children_running(pid: int, marker: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if marker in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


# Run by the runner's own Python, as the runner is started: what it can read and write.
PROBE = """
import json, os, sys
data_dir, base_dir, jobs = sys.argv[1:4]
def can(f):
    try:
        f(); return True
    except OSError:
        return False
def write(path):
    with open(path, "w") as f: f.write("x")
print(json.dumps({
    "uid": os.getuid(), "groups": os.getgroups(), "umask": os.umask(0o077),
    "env": dict(os.environ),
    "list_data_dir": can(lambda: os.listdir(data_dir)),
    "read_secret_key": can(lambda: open(os.path.join(data_dir, "secret_key")).read()),
    "read_database": can(lambda: open(os.path.join(data_dir, "platform.sqlite3"), "rb").read(1)),
    "read_media": can(lambda: os.listdir(os.path.join(data_dir, "media"))),
    "write_data_dir": can(lambda: write(os.path.join(data_dir, "planted"))),
    "write_code": can(lambda: write(os.path.join(base_dir, "planted.py"))),
    "write_jobs_dir": can(lambda: write(os.path.join(jobs, "planted"))),
    "list_jobs_dir": can(lambda: os.listdir(jobs)),
    "write_own_workdir": can(lambda: write("own-file")),
}))
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
def test_a_running_job_runner_holds_no_secret_and_runs_unprivileged(team, owner):
    """A real job on the suite's train worker: its runner process (found under the worker)
    holds none of the worker's secrets and, as root, is not root; then the runner's own
    Python, started with exactly what the worker starts the runner with
    (``runner_popen_args``), tries the data directory, the code and the directory
    of all jobs' work directories; once the runner is gone, its directory is not its user's."""
    from labeling.datasets import dataset_create

    data_dir = Path(settings.DATA_DIR)
    (data_dir / "secret_key").write_text("the-platform-secret-key-0123456789")
    (data_dir / "platform.sqlite3").write_bytes(b"SQLite format 3\0")
    dataset = dataset_create(
        actor=owner, team=team, name="sandbox", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 200)
    version = make_jsonl_version(dataset, owner, rows, mapping)
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        hyperparameters={"epochs": 500, "early_stopping_patience": 0},
    )
    job = wait_for(job, until=lambda j: j.step > 0 or j.status == "failed")
    assert job.status == "running", job.error
    [runner] = children_running(job.pid, "runtime.run")
    try:
        env = environ_of(runner.pid)
        secrets = {**secrets_of_this_process(), **_worker_secrets(job.pid)}
        assert_no_secrets(env, secrets)
        assert env["HOME"].startswith(str(job_workdir(job)))
        if ROOT:
            assert runner.uids().real != 0 and runner.uids().effective != 0
            assert runner.uids().real == runner_sandbox(job).uid
            assert 0 not in (runner.gids().real, runner.gids().effective)

        started = runner_popen_args(job, job_workdir(job))
        started["args"] = [
            settings.TRAINING_PYTHON,
            "-c",
            PROBE,
            str(data_dir),
            str(settings.BASE_DIR),
            str(job_workdir(job).parent),
        ]
        probe = subprocess.run(**started, capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        assert_no_secrets(seen["env"], secrets)
        assert seen["write_own_workdir"] and seen["umask"] == 0o077
        if ROOT:
            assert seen["uid"] == runner_sandbox(job).uid != 0
            assert 0 not in seen["groups"]
            refused = [
                "list_data_dir",
                "read_secret_key",
                "read_database",
                "read_media",
                "write_data_dir",
                "write_code",
                "write_jobs_dir",
                "list_jobs_dir",
            ]
            assert {k: seen[k] for k in refused} == dict.fromkeys(refused, False)

        # The runner dies: the job fails, and its work directory (its team's rows, kept for a
        # retry) is closed to the runner's user, whose next job may be another team's.
        runner.kill()
        job = wait_for(job)
        assert job.status == "failed"
        workdir = job_workdir(job).stat()
        if ROOT:
            assert (workdir.st_uid, workdir.st_mode & 0o077) == (0, 0)
    finally:
        if job.status == "running":
            training_job_cancel(actor=owner, job=job)
            wait_for(job, timeout=30)


# Run as a job's runner (``runner_popen_args``): what it can do to another job's
# directory, and a process it leaves behind (setsid: out of its process group, no
# parent-death signal), whose pid it prints.
NEIGHBOUR = """
import json, os, subprocess, sys
other = sys.argv[1]
def can(f):
    try:
        f(); return True
    except OSError:
        return False
left = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(json.dumps({
    "uid": os.getuid(),
    "list_other": can(lambda: os.listdir(other)),
    "read_other": can(lambda: open(os.path.join(other, "spec.json")).read()),
    "write_other": can(lambda: open(os.path.join(other, "planted"), "w").write("x")),
    "left": left.pid,
}))
"""


def _as_runner(job, script: str, *args: str) -> dict:
    started = runner_popen_args(job, job_workdir(job))
    started["args"] = [settings.TRAINING_PYTHON, "-c", script, *args]
    done = subprocess.run(**started, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not ROOT, reason="a uid per job needs root to switch")
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
def test_jobs_run_as_uids_of_their_own_and_leave_no_process_behind(team, owner):
    """Two teams' jobs at once on one node: each runner has a uid of its own, neither reads
    nor writes the other's directory; a process a runner leaves behind (setsid) dies with
    its job, however the job ends (here: cancelled, and failed)."""
    from labeling.datasets import dataset_create

    rows, mapping = rows_for("text_classification", 200)
    jobs = []
    for name in ("first", "second"):
        dataset = dataset_create(actor=owner, team=team, name=name, task_kind="text_classification")
        version = make_jsonl_version(dataset, owner, rows, mapping)
        jobs.append(
            training_job_submit(
                actor=owner,
                team=team,
                dataset_version=version,
                hyperparameters={"epochs": 500, "early_stopping_patience": 0},
            )
        )
    try:
        a, b = (wait_for(j, until=lambda j: j.step > 0 or j.status == "failed") for j in jobs)
        assert (a.status, b.status) == ("running", "running"), (a.error, b.error)
        seen_a = _as_runner(a, NEIGHBOUR, str(job_workdir(b)))
        seen_b = _as_runner(b, NEIGHBOUR, str(job_workdir(a)))
        assert seen_a["uid"] != seen_b["uid"]
        assert 0 not in (seen_a["uid"], seen_b["uid"])
        for seen in (seen_a, seen_b):
            assert not (seen["list_other"] or seen["read_other"] or seen["write_other"]), seen
            assert psutil.pid_exists(seen["left"])
        training_job_cancel(actor=owner, job=a)
        assert wait_for(a, timeout=60).status == "cancelled"
        [runner] = children_running(b.pid, "runtime.run")
        runner.kill()
        assert wait_for(b, timeout=60).status == "failed"
        for seen in (seen_a, seen_b):
            assert not _alive(seen["left"]), "a runner's leftover process outlived its job"
    finally:
        for job in jobs:
            job.refresh_from_db()
            if job.status == "running":
                training_job_cancel(actor=owner, job=job)
                wait_for(job, timeout=30)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Run as a failed job's runner: links for root to follow, where root reads or writes.
PLANT = """
import os, sys
secret, target = sys.argv[1:3]
os.unlink("spec.json")
os.symlink(target, "spec.json")
os.makedirs("log", exist_ok=True)
os.symlink(secret, "log/node-1.out")
os.makedirs("export", exist_ok=True)
os.symlink(secret, "export/model.pdiparams")
os.symlink(os.path.dirname(secret), "best")
os.makedirs("data/sub", exist_ok=True)
os.chmod("data/sub", 0o777)
os.unlink("data/train.jsonl")
os.symlink(secret, "data/train.jsonl")
print("{}")
"""


@pytest.mark.skipif(not ROOT, reason="the runner is another user only where the platform is root")
@pytest.mark.django_db
def test_links_a_runner_plants_are_not_followed_by_the_platform(team, owner, tmp_path, settings):
    """A runner plants links to the secret key (and to a file of root's) where the platform,
    as root, writes on a re-attempt (spec.json, data/) and reads once the runner ends (its
    export and best checkpoint, the log of a part on another node) and leaves a subdirectory
    open to all: the job's error holds no byte of the key, the directory taken
    back is root's to the last entry, the outputs are refused without a byte of the target,
    and preparing the retry replaces the links instead of writing through them."""
    from labeling.datasets import dataset_create
    from training.models import TrainingJob

    secret_value = "the-platform-secret-key-0123456789"
    secret = Path(settings.DATA_DIR) / "secret_key"
    secret.write_text(secret_value)
    target = tmp_path / "root-file"
    target.write_text("root's own")
    dataset = dataset_create(actor=owner, team=team, name="links", task_kind="text_classification")
    rows, mapping = rows_for("text_classification", 40)
    version = make_jsonl_version(dataset, owner, rows, mapping)
    # A job as a worker has it after a failed attempt (never queued: the test is its runner).
    job = TrainingJob.objects.create(
        team=team,
        name="links",
        dataset_version=version,
        task_kind="text_classification",
        labels=sorted({r["label"] for r in rows}),
        hyperparameters={},
        status="failed",
        attempts=1,
        created_by=owner,
    )
    workdir = job_workdir(job)
    _prepare_workdir(job, workdir)
    _as_runner(job, PLANT, str(secret), str(target))

    # The job spans two nodes and this one's part fails (its launcher exits at once): the
    # part's log, whose tail goes into the job's error, is not the link to the secret key.
    TrainingJob.objects.filter(pk=job.pk).update(
        status="running",
        device_count=2,
        rendezvous="127.0.0.1:9",
        placement=[
            {"node": "elsewhere", "devices": [0], "address": ""},
            {"node": settings.NODE_NAME, "devices": [0], "address": ""},
        ],
    )
    settings.TRAINING_PYTHON = "/bin/false"
    training_job_part_execute(job.pk, 1, 1)
    job.refresh_from_db()
    assert job.status == "failed" and "Part 1" in job.error, job.error
    assert secret_value not in job.error
    assert secret.read_text() == secret_value

    user = runner_sandbox(job)
    sandbox.take_back(user, workdir)
    for root, dirs, files in os.walk(workdir):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            st = os.lstat(name)
            assert st.st_uid == 0, name
            assert st.st_mode & 0o077 == 0 or os.path.islink(name), name
    with pytest.raises(PermissionError) as refused:
        sandbox.check_outputs(user, [workdir / "export", workdir / "best"])
    assert secret_value not in str(refused.value)

    _prepare_workdir(job, workdir)  # the retry's
    assert target.read_text() == "root's own"
    assert not (workdir / "spec.json").is_symlink()
    assert json.loads((workdir / "spec.json").read_text())["job_id"] == job.pk
    assert not (workdir / "data" / "train.jsonl").is_symlink()
    assert secret_value not in (workdir / "data" / "train.jsonl").read_text()
    shutil.rmtree(workdir, ignore_errors=True)


def _worker_secrets(pid: int) -> dict[str, str]:
    env = environ_of(pid)
    return {n: env[n] for n in SECRET_NAMES if env.get(n)}


def test_a_predictor_process_holds_no_secret_and_runs_unprivileged(fresh_host, exports):
    """The serving host holds the management secret; the predictor process it starts for a
    revision does not, nor any other secret of the host's, and (as root) is not root."""
    load(fresh_host, "rev-sandbox", exports("text_classification"))
    route(fresh_host, "reviews", {"rev-sandbox": 100})
    assert fresh_host.predict("reviews", {"inputs": ["好"]}, KEY).status_code == 200
    [predictor] = children_running(fresh_host.proc.pid, "serving.replica")
    host_env = environ_of(fresh_host.proc.pid)
    secrets = {n: host_env[n] for n in SECRET_NAMES if host_env.get(n)}
    assert "SERVING_SECRET" in secrets
    assert_no_secrets(environ_of(predictor.pid), secrets)
    if ROOT:
        # A uid of the revision's own (PLATFORM_RUNNER_UID_BASE), not the shared user's.
        assert predictor.uids().effective >= 200000
        assert predictor.uids().effective not in (0, sandbox.runner_user("").uid)
        # It reads a staged copy of the model, not the platform's (or the test's) own files.
        assert not predictor.cwd().startswith(str(settings.DATA_DIR))


LOOPING = (
    "{% for i in range(10**9) %}x{% endfor %}",
    "{% for a in range(9999) %}{% for b in range(9999) %}{% endfor %}{% endfor %}",
    "{{ 'x' * 10**10 }}",
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s }}",
    "{{ '%0999999999d' % 1 }}",
    # Small numbers, huge work: a million references to a million characters, joined.
    "{% set s = 'a'.ljust(999999) %}{{ ([s] * 999999)|join }}",
    "{% set s = 'a'.ljust(999999) %}{% set l = [s, s, s, s] %}{{ ''.join([l, l]|sum(start=[])) }}",
    "{% set s = 'a'.ljust(999999) %}{% set l = [s, s, s, s] %}{{ [l, l, l, l]|join }}",
    "{{ ('\t' * 999999).expandtabs(999999) }}",
    "{{ ('a' * 999999).replace('a', 'bbbbbbbbbb') }}",
    "{{ ('{:999999}' * 1000).format(*range(1000)) }}",
    "{{ ('x\n' * 400000)|indent(999999) }}",
    # 99,000 calls on a million characters each (150 s before they were counted as work).
    "{% set s = 'a'.ljust(999999) %}{% for i in range(9900) %}{% for j in range(10) %}"
    "{% set t = s.upper() %}{% endfor %}{% endfor %}",
)


@pytest.mark.parametrize("template", LOOPING)
def test_a_chat_template_that_loops_for_ever_is_refused_at_import(llm_dirs, tmp_path, template):
    """At import (base models are validated before any job or endpoint renders their
    template) and where the runner and the serving host render it, within seconds."""
    model = tmp_path / "looping"
    shutil.copytree(llm_dirs["torch"], model)
    (model / "chat_template.jinja").write_text(template)
    started = time.monotonic()
    with pytest.raises(ValidationError, match="chat template was stopped"):
        inspect_model_dir(model, "torch")
    with pytest.raises(ChatTemplateError, match="chat template was stopped"):
        ChatTokenizer(model).render([{"role": "user", "content": "你好"}], True)
    assert time.monotonic() - started < 5


def test_a_chat_template_costly_only_for_longer_conversations_is_refused_at_import(
    llm_dirs,
    tmp_path,
):
    """A template that renders the two-message sample cheaply and longer conversations at
    great cost is tried on several conversations at import (1 to 9 turns, system and tool)."""
    model = tmp_path / "dodging"
    shutil.copytree(llm_dirs["torch"], model)
    (model / "chat_template.jinja").write_text(
        "{% if messages|length > 2 %}{% for i in range(10**9) %}x{% endfor %}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    started = time.monotonic()
    with pytest.raises(ValidationError, match="chat template was stopped"):
        inspect_model_dir(model, "torch")
    assert time.monotonic() - started < 5
