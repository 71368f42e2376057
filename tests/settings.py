"""The platform's own settings, with what a test run needs on top."""

import os

os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production-0123456789")

from console.settings import *  # noqa: F403
from console.settings import STORAGES

# Fast hashing: tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# No collectstatic in tests: serve the apps' static files as they are.
STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
