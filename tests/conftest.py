import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db import DatabaseError
from django.test import TransactionTestCase
from django.utils import translation

from console.models import Membership, Team
from console.roles import Role
from tests.helpers.models import CHARS, MAKE_LLM, MAKE_PADDLE, model_dir
from tests.helpers.system import SmallDisk
from tests.helpers.workers import start_train_worker, start_worker, stop_worker

# tests/runtime runs in the runtime venv (make test), without Django.
collect_ignore = ["runtime"]
# Trained exports, a serving host process: for tests/deployment and the browser tests.
pytest_plugins = ["tests.deployment.fixtures"]

_flush = TransactionTestCase._fixture_teardown


def _flush_again_after_a_deadlock(self) -> None:
    """A transactional test's flush (one TRUNCATE of every table) can deadlock with the
    suite's real workers, which go on writing after a test has seen what it waited for (a
    node's heartbeat registering its devices again, a finished job's audit line); PostgreSQL
    then aborts the flush. It is tried again once they are done."""
    for attempt in range(5):
        try:
            return _flush(self)
        except CommandError as exc:
            if attempt == 4 or not isinstance(exc.__cause__, DatabaseError):
                raise
            time.sleep(1 + attempt)


TransactionTestCase._fixture_teardown = _flush_again_after_a_deadlock  # type: ignore[method-assign]


@pytest.fixture
def make_user(db):
    def make(username: str, password: str = "pw-Secret-123", **extra):
        return get_user_model().objects.create_user(username=username, password=password, **extra)

    return make


@pytest.fixture
def make_team(db):
    def make(name: str, members: dict | None = None) -> Team:
        team = Team.objects.create(name=name, slug=name.lower())
        for user, role in (members or {}).items():
            Membership.objects.create(team=team, user=user, role=role)
        return team

    return make


@pytest.fixture
def english():
    """Messages are asserted in English; the console's default language is Chinese. Autouse
    in the folders whose tests all assert English (their conftest modules)."""
    with translation.override("en"):
        yield


@pytest.fixture
def owner(make_user):
    return make_user("olivia")


@pytest.fixture
def team(make_team, owner):
    return make_team("Alpha", {owner: Role.OWNER})


@pytest.fixture(scope="session", autouse=True)
def _suite_redis_emptied() -> None:
    """The suite's Redis database (each process of the suite has its own: tests/settings.py)
    starts empty: a run killed midway leaves its queued tasks there, which this run's workers
    would take for this run's jobs of the same ids."""
    import redis

    from console.health import redis_client

    try:
        redis_client().flushdb()
    except redis.ConnectionError:
        pass  # no Redis: the tests that need one say so


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup) -> Iterator[subprocess.Popen]:
    """A real Celery worker on the suite's Redis and test database, queue `default`."""
    proc = start_worker("default", f"test-{os.getpid()}")
    yield proc
    stop_worker(proc)


@pytest.fixture(scope="session")
def train_worker(django_db_setup, celery_worker_process):
    """A real train worker (prefork: a killed job process is a lost worker, and its task is
    given back) on a node with two CPU slots, queue train.cpu, beside the `default` worker."""
    proc = start_train_worker(f"suite-{os.getpid()}", "cpu:2")
    yield proc
    stop_worker(proc)


@pytest.fixture(scope="session")
def paddle_base(django_db_setup) -> Path:
    """A real ERNIE saved by PaddleNLP (paddle.save: model_state.pdparams), in its layout under
    the server's import directory."""
    return model_dir(MAKE_PADDLE, "ernie-mini", CHARS, env={"USE_TORCH": "0"})


@pytest.fixture(scope="session")
def llm_dirs(django_db_setup) -> dict[str, Path]:
    """A tiny causal LM of the LLaMA architecture in each backend's layout, with its character
    tokenizer and chat template, under the server's import directory."""
    return {b: model_dir(MAKE_LLM, f"tiny-llama-{b}", b) for b in ("paddle", "torch")}


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    """Needs root (mount), as CI has; elsewhere the test is skipped and says why. Not under
    pytest's tmp_path (0700): job runners, as PLATFORM_RUNNER_USER, work on it."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="small-disk-"))
    path.chmod(0o711)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        path.rmdir()
        if os.environ.get("CI"):
            pytest.fail(f"CI=true and a tmpfs cannot be mounted: {mounted.stderr!r}")
        pytest.skip(f"a full disk is simulated with a tmpfs, which needs root: {mounted.stderr!r}")
    yield SmallDisk(path)
    subprocess.run(["umount", "-l", str(path)], check=False)
    shutil.rmtree(path, ignore_errors=True)


def pytest_report_header(config) -> list[str]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    return [
        f"database: {db['ENGINE']} {db.get('HOST') or db['NAME']}",
        f"redis: {settings.REDIS_URL}",
    ]


@pytest.fixture(scope="session")
def ldap_server():
    """One real OpenLDAP server for the session (tests/helpers/ldap.py)."""
    from tests.helpers.ldap import SLAPD, Directory

    if not Path(SLAPD).exists():
        message = f"directory tests need slapd at {SLAPD} (apt-get install slapd)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = Directory().start()
    yield server
    server.stop()


@pytest.fixture
def directory(ldap_server, settings, db):
    """The platform configured for the test directory: search-then-bind as the platform's
    reader account, StartTLS against the server's own certificate, nested groups, disabled
    people filtered out, its groups mapped to the team ``nlp``."""
    from tests.helpers import ldap as d

    settings.LDAP_SERVER_URI = ldap_server.url
    settings.LDAP_START_TLS = True
    settings.LDAP_CA_FILE = str(ldap_server.ca_file)
    settings.LDAP_BIND_DN = d.READER_DN
    settings.LDAP_BIND_PASSWORD = d.READER_PASSWORD
    settings.LDAP_USER_SEARCH_BASE = d.PEOPLE
    settings.LDAP_USER_FILTER = "(&(uid=%(user)s)(!(employeeType=disabled)))"
    settings.LDAP_USER_DN_TEMPLATE = ""
    settings.LDAP_GROUP_SEARCH_BASE = d.GROUPS
    settings.LDAP_GROUP_TYPE = "nested-groupOfNames"
    settings.LDAP_STAFF_GROUP = f"cn=platform-admins,{d.GROUPS}"
    settings.LDAP_TEAM_MAP = json.dumps(
        {
            f"cn=nlp-engineers,{d.GROUPS}": "nlp:maintainer",
            f"cn=nlp-leads,{d.GROUPS}": "nlp:owner",
            f"cn=annotators,{d.GROUPS}": "nlp:annotator",
        }
    )
    return ldap_server


@pytest.fixture(scope="session")
def oidc_provider():
    """One real OpenID provider for the session's test-client logins (tests/helpers/oidc.py)."""
    from tests.helpers import oidc

    if reason := oidc.missing():
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    provider = oidc.Provider(["http://testserver"]).start()
    yield provider
    provider.stop()


def configure_sso(settings, provider) -> None:
    """The platform configured for ``provider``, its groups mapped to the team ``nlp``."""
    from tests.helpers import oidc

    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_CLIENT_ID = oidc.CLIENT_ID
    settings.OIDC_CLIENT_SECRET = oidc.CLIENT_SECRET
    settings.OIDC_STAFF_GROUP = "platform-admins"
    settings.OIDC_PROVIDER_NAME = "统一身份认证"
    settings.OIDC_TEAM_MAP = json.dumps(
        {"nlp-engineers": "nlp:maintainer", "nlp-leads": "nlp:owner"}
    )


@pytest.fixture
def sso(oidc_provider, settings, db):
    configure_sso(settings, oidc_provider)
    oidc_provider.set("sub-zhangwei", groups=["nlp-engineers"])  # as a test may have left it
    return oidc_provider
