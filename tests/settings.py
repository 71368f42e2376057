"""The platform's own settings, with what a test run needs on top."""

import os
import tempfile

# `make test` runs the suite in processes of its own (pytest-xdist: gw0, gw1, ...), each with its
# own test database (pytest-django). Each is a platform of its own beside the others on the one
# Redis and Label Studio: its own data directory and ports (not the ones pytest's first process
# chose before starting them), its own Redis database (queues, workers' broadcasts), its own
# domain of Label Studio accounts (a team's organisation is found by its service account's)
# and SECRET_KEY (the service accounts' tokens are derived from it and the team's id, and
# Label Studio's token keys are unique), and its own range of runner uids (a job's end kills
# every process of its uids, and job ids repeat across the databases). Once per process: the
# workers and runners it starts inherit the variables, and read these settings again.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if XDIST_WORKER and os.environ.get("PLATFORM_TEST_PROCESS") != XDIST_WORKER:
    os.environ["PLATFORM_TEST_PROCESS"] = XDIST_WORKER
    os.environ.pop("PLATFORM_DATA_DIR", None)
    os.environ.pop("SERVING_PORT", None)
    os.environ.pop("EMAIL_PORT", None)
    _index = int(XDIST_WORKER.removeprefix("gw"))
    if _index:
        if "REDIS_URL" in os.environ:
            _base, _db = os.environ["REDIS_URL"].rsplit("/", 1)
            os.environ["REDIS_URL"] = f"{_base}/{int(_db or 0) + _index}"
        os.environ["LABEL_STUDIO_ACCOUNT_DOMAIN"] = f"gw{_index}.annotators.test"
        os.environ["SECRET_KEY"] = f"test-secret-key-gw{_index}-not-for-production-0123456789"
        os.environ["PLATFORM_RUNNER_UID_BASE"] = str(200000 + _index * 20_000_000)
os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production-0123456789")
# Files of a test run (storage, uploads) go to a directory of its own, never var/.
os.environ.setdefault("PLATFORM_DATA_DIR", tempfile.mkdtemp(prefix="platform-test-"))
os.environ.setdefault("SERVING_SECRET", "test-serving-secret-0123456789")
# The suite's jobs make the ONNX target only: the lite one (seconds and some 100 MB a fast
# model) has tests of its own (tests/runtime/test_lite.py, tests/training/test_lite_target.py).
os.environ.setdefault("PLATFORM_EXPORT_TARGETS", "onnx")
# Prometheus's /metrics ask for a token (tests/test_prometheus.py); the console's address rule
# without one is tested with the setting emptied (tests/security/test_metrics.py).
os.environ.setdefault("PLATFORM_METRICS_TOKEN", "test-metrics-token-0123456789")
# Notifications (tests/test_notifications.py): the suite's SMTP server listens on this port
# (the workers the suite starts inherit it), robots are the test's own receiver on loopback,
# and a failed delivery is tried again after a second.
if "EMAIL_PORT" not in os.environ:
    import socket

    with socket.socket() as _s:
        _s.bind(("127.0.0.1", 0))
        os.environ["EMAIL_PORT"] = str(_s.getsockname()[1])
os.environ.setdefault("EMAIL_HOST", "127.0.0.1")
os.environ.setdefault("NOTIFY_ROBOT_HOSTS", "127.0.0.1")
os.environ.setdefault("NOTIFY_RETRY_S", "1")
# A running job's quota is checked every second, not every minute (tests/training/test_usage.py).
os.environ.setdefault("TRAINING_QUOTA_CHECK_S", "1")
if "SERVING_PORT" not in os.environ:
    # The suite's serving host listens here; the workers the suite starts inherit it.
    import socket

    with socket.socket() as _s:
        _s.bind(("127.0.0.1", 0))
        os.environ["SERVING_PORT"] = str(_s.getsockname()[1])

# After the environment above, which the platform's settings read.
from console.settings import *  # noqa: E402, F403
from console.settings import DATA_DIR, DATABASES, STORAGES  # noqa: E402

# Fast hashing: tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# No collectstatic in tests: serve the apps' static files as they are.
STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# A file, not memory, for SQLite's test database: the suite's Celery worker opens it too.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
