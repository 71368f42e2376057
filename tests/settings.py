"""The platform's own settings, with what a test run needs on top."""

import os
import tempfile

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

from console.settings import *  # noqa: F403
from console.settings import DATA_DIR, DATABASES, STORAGES

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
