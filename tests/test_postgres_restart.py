"""PostgreSQL stopped and started again under the web console (gunicorn, as `make run` runs it)
while clients keep writing: requests in the gap get a clean 503 that says to try again, the
console recovers by itself once the database is back, and no half-written object remains.

The PostgreSQL is this test's own (initdb into a temporary directory, on a free port), so the
suite's database is not disturbed."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import requests

from runtime.net import free_port
from tests.helpers.system import ROOT, spare_redis_url

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = pytest.mark.xdist_group("postgres-restart")


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    path = found[-1] if found else shutil.which("initdb")
    return Path(path).parent if path else None


class OwnPostgres:
    def __init__(self, root: Path) -> None:
        self.bin = pg_bin()
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        # PostgreSQL refuses to run as root: as the `postgres` account then, as packages do.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}")

    def init(self) -> None:
        if self.as_user:
            shutil.chown(self.root, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        # -m fast, as `systemctl restart postgresql` does: open transactions are rolled back.
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


@pytest.fixture(scope="module")
def own_postgres():
    if pg_bin() is None:
        pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    # Not under pytest's temporary directory, which the `postgres` account cannot enter.
    root = Path(tempfile.mkdtemp(prefix="platform-pg-"))
    pg = OwnPostgres(root)
    pg.init()
    pg.start()
    yield pg
    try:
        pg.stop()
    except RuntimeError:
        pass
    shutil.rmtree(root, ignore_errors=True)


def manage(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


SETUP = """
from django.contrib.auth import get_user_model
from console import services
user = get_user_model().objects.create_user("pg-owner", password="pw-Secret-123", is_staff=True)
team = services.team_create(actor=user, name="PG")
print(team.slug, services.api_token_create(actor=user, name="load")[1])
"""


def redis_of_this_test() -> str:
    """A Redis database of the suite's server that no other process of the suite uses: the
    processes of this test find only their own tasks there."""
    import redis

    url = spare_redis_url()
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def platform_env(own_postgres) -> dict:
    """The environment of the platform's processes on the test's own PostgreSQL, migrated."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": own_postgres.url,
        "REDIS_URL": redis_of_this_test(),
    }
    manage(env, "migrate", "--verbosity", "0")
    return env


@pytest.fixture(scope="module")
def console_on_own_postgres(platform_env):
    env = platform_env
    slug, token = manage(env, "shell", "-c", SETUP).split()[-2:]
    port = free_port()
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "console.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            "4",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(url + "/login/", timeout=10)
            break
        except requests.RequestException:
            assert web.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.3)
    yield url, slug, token
    web.terminate()
    web.wait(timeout=30)


def test_a_postgres_restart_fails_requests_cleanly_and_leaves_nothing_half_written(
    own_postgres, console_on_own_postgres
):
    url, slug, token = console_on_own_postgres
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    browser = requests.Session()
    login = browser.get(url + "/login/", timeout=10)
    assert login.status_code == 200
    browser.post(
        url + "/login/",
        {
            "username": "pg-owner",
            "password": "pw-Secret-123",
            "csrfmiddlewaretoken": browser.cookies["platform_csrftoken"],
        },
        headers={"Referer": url + "/login/"},
        timeout=10,
    )
    page = f"{url}/t/{slug}/datasets/"
    assert browser.get(page, timeout=10).status_code == 200

    results: list[tuple[str, int, str]] = []
    stop = threading.Event()

    def write(writer: int) -> None:
        for i in range(100_000):
            if stop.is_set():
                return
            name = f"ds-{writer}-{i}"
            try:
                r = api.post(
                    f"{url}/api/v1/teams/{slug}/datasets/",
                    json={"name": name, "task_kind": "text_classification"},
                    timeout=30,
                )
                results.append((name, r.status_code, r.text))
            except requests.RequestException as exc:  # the console itself must not go away
                results.append((name, 0, repr(exc)))

    writers = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for w in writers:
        w.start()
    time.sleep(2)
    own_postgres.stop()
    # The database is down: a page and an API call both say so, with a 503, not a 500.
    down_page = browser.get(page, timeout=30)
    down_api = api.get(f"{url}/api/v1/teams/{slug}/datasets/", timeout=30)
    time.sleep(1)
    own_postgres.start()
    time.sleep(2)
    stop.set()
    for w in writers:
        w.join(timeout=60)

    assert down_page.status_code == 503 and down_page.headers["Retry-After"] == "5"
    assert "<h1>503</h1>" in down_page.text
    assert down_api.status_code == 503 and down_api.json()["detail"]
    codes = {code for _, code, _ in results}
    assert codes <= {201, 503}, [r for r in results if r[1] not in (201, 503)][:3]
    assert 503 in codes and 201 in codes
    # Recovered by itself: the same session and token work again.
    assert browser.get(page, timeout=10).status_code == 200
    after = api.post(
        f"{url}/api/v1/teams/{slug}/datasets/",
        json={"name": "after", "task_kind": "text_classification"},
        timeout=10,
    )
    assert after.status_code == 201, after.text

    # Nothing half-written: every dataset has the audit event written in its transaction, and
    # every dataset the console said it created exists.
    with psycopg.connect(own_postgres.url) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM labeling_dataset")}
        unaudited = conn.execute(
            "SELECT count(*) FROM labeling_dataset d WHERE NOT EXISTS (SELECT 1 FROM"
            " console_auditevent a WHERE a.action = 'dataset.create'"
            " AND a.target_id = d.id::text)"
        ).fetchone()[0]
    assert unaudited == 0
    assert {name for name, code, _ in results if code == 201} <= names


TRAINING_SETUP = """
from django.contrib.auth import get_user_model
from django.db import transaction
from console.models import Team
from labeling.datasets import dataset_create
from tests.helpers.data import make_jsonl_version, rows_for
from training.jobs import training_job_submit

user = get_user_model().objects.get(username="pg-owner")
team = Team.objects.get(slug="pg")
with transaction.atomic():  # the import runs here, as in a `db` test
    dataset = dataset_create(
        actor=user, team=team, name="训练", task_kind="text_classification"
    )
    rows, mapping = rows_for("text_classification", 60)
    version = make_jsonl_version(dataset, user, rows, mapping)
hp = {
    "epochs": 25,
    "batch_size": 8,
    "max_seq_length": 32,
    "checkpoint_steps": 4,
    "early_stopping_patience": 0,  # long enough to run through the restart
}
job = training_job_submit(
    actor=user, team=team, dataset_version=version, hyperparameters=hp
)
print(job.pk)
"""


def test_a_training_job_running_through_a_postgres_restart_finishes(
    own_postgres, platform_env, console_on_own_postgres
):
    from tests.helpers.workers import start_train_worker, stop_worker

    assert console_on_own_postgres[1] == "pg"  # the team of TRAINING_SETUP
    job_id = int(manage(platform_env, "shell", "-c", TRAINING_SETUP).split()[-1])
    worker = start_train_worker(
        f"pg-restart-{os.getpid()}",
        "cpu:1",
        {"DATABASE_URL": own_postgres.url, "REDIS_URL": platform_env["REDIS_URL"]},
        wait=False,
    )

    def job() -> tuple:
        with psycopg.connect(own_postgres.url) as conn:
            return conn.execute(
                "SELECT status, step, total_steps, error, finished_at FROM training_trainingjob"
                " WHERE id = %s",
                (job_id,),
            ).fetchone()

    try:
        deadline = time.monotonic() + 180
        while not (job()[0] == "running" and job()[1] > 0):
            assert time.monotonic() < deadline, job()
            time.sleep(0.5)
        own_postgres.stop()
        time.sleep(3)  # the supervisor's writes fail meanwhile
        own_postgres.start()
        restarted = datetime.now(UTC)
        deadline = time.monotonic() + 300
        while job()[0] in ("queued", "running"):
            assert time.monotonic() < deadline, job()
            time.sleep(1)
    finally:
        stop_worker(worker)
    status, step, total, error, finished_at = job()
    assert status == "succeeded", error
    assert step == total > 0
    assert finished_at > restarted  # it ran through the restart
