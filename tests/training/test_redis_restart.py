"""Redis restarted under the platform: a Redis of this test's own, persisted as `make run`'s
embedded Redis is (append-only file), and a train worker on it started as `make run` starts it.
Jobs queued before the restart are not lost, and a job running through it finishes once."""

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from tests.helpers.jobs import wait_for
from tests.helpers.system import ROOT
from tests.helpers.workers import start_train_worker, stop_worker, suite_database_url
from training.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"epochs": 2, "batch_size": 16, "max_seq_length": 32}


def embedded_redis():
    """platform/embedded_redis.py, loaded by path (``platform`` is not a package)."""
    spec = importlib.util.spec_from_file_location("embedded", ROOT / "platform/embedded_redis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OwnRedis:
    """A redis-server with the embedded default's persistence, restartable on its port."""

    def __init__(self, data_dir: Path) -> None:
        self.module = embedded_redis()
        self.port = self.module.free_port()
        self.data_dir = data_dir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = self.module.server_args(self.port, self.data_dir, persist=True)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        self.module.wait_until_up(self.port, self.proc)

    def restart(self) -> None:
        # SIGTERM, as systemd or honcho stop it: Redis writes its append-only file and exits.
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def own_redis(tmp_path):
    redis = OwnRedis(tmp_path / "redis")
    redis.data_dir.mkdir()
    redis.start()
    yield redis
    redis.stop()


def submit(redis: OwnRedis, owner, team, version, epochs: int = 2) -> TrainingJob:
    """Submit through the platform's service in a process of its own whose Celery sends to
    this test's Redis (as the web console's would)."""
    code = (
        "import django, sys; django.setup();"
        "from django.contrib.auth import get_user_model;"
        "from console.models import Team; from labeling.models import DatasetVersion;"
        "from training.jobs import training_job_submit;"
        "User = get_user_model();"
        "job = training_job_submit(actor=User.objects.get(pk=int(sys.argv[1])),"
        " team=Team.objects.get(pk=int(sys.argv[2])),"
        " dataset_version=DatasetVersion.objects.get(pk=int(sys.argv[3])),"
        f" hyperparameters={{**{FAST!r}, 'epochs': int(sys.argv[4])}});"
        "print(job.pk)"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": suite_database_url(),
        "REDIS_URL": redis.url,
    }
    args = [str(owner.pk), str(team.pk), str(version.pk), str(epochs)]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return TrainingJob.objects.get(pk=int(done.stdout.split()[-1]))


def test_queued_jobs_survive_a_redis_restart_and_a_running_job_finishes_once(
    team, owner, make_dataset, own_redis, celery_worker_process
):
    version = make_dataset(n=60)
    # No worker yet: the job waits in Redis, and Redis restarts.
    queued = submit(own_redis, owner, team, version)
    own_redis.restart()

    worker = start_train_worker(
        f"redis-restart-{os.getpid()}", "cpu:1", {"REDIS_URL": own_redis.url}, wait=False
    )
    try:
        queued = wait_for(queued, timeout=240)
        assert queued.status == "succeeded", queued.error
        assert queued.attempts == 1

        # A job running while Redis restarts: its runner goes on, and it ends once.
        long = submit(own_redis, owner, team, version, epochs=30)
        behind = submit(own_redis, owner, team, version)
        long = wait_for(long, until=lambda j: j.status == "running" and j.step > 0)
        own_redis.restart()
        restarted = timezone.now()
        long = wait_for(long, timeout=240)
        assert long.status == "succeeded", long.error
        assert long.finished_at > restarted  # it ran through the restart
        assert long.attempts == 1 and long.step == long.total_steps
        behind = wait_for(behind, timeout=240)
        assert behind.status == "succeeded", behind.error
    finally:
        stop_worker(worker)
