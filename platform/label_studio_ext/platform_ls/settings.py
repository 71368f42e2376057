"""Label Studio's settings as the platform runs it (``platform_ls.settings``).

Label Studio's community edition shows a project to any account that asks for its id: its
``ProjectMixin.has_permission`` only refuses a *revoked* member ("LSO always runs a single
organization"). The platform keeps one organisation per team, so a project is reachable only by
the members of its organisation (``platform_ls.mixins``). The private-address guard is on for
every Label Studio account; only the platform's own webhook receiver is let through
(``platform_ls.apps``).
"""

import os

# Label Studio's settings module reads django.conf.settings while it is imported (Sentry, its
# versions): the base settings must already be in this module when it does.
from label_studio.core.settings.base import *  # noqa: F403
from label_studio.core.settings.label_studio import *  # noqa: F403
from label_studio.core.settings.label_studio import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "platform_ls.apps.PlatformConfig"]

# Label Studio's SQLite database is written by its server and by the platform's administration
# runs (platform_ls.manage) at once: a writer waits up to 30 s for the other's lock instead of
# failing with "database is locked" after Django's 5.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 30  # noqa: F405
PROJECT_MIXIN = "platform_ls.mixins.ProjectMixin"

# Webhooks, URL imports and storages: no private, loopback or link-local address. Set here, not
# from the environment: an operator's USE_DEFAULT_BANNED_SUBNETS=false does not switch it off.
SSRF_PROTECTION_ENABLED = True
USE_DEFAULT_BANNED_SUBNETS = True
# Files on Label Studio's host are not served to its accounts.
LOCAL_FILES_SERVING_ENABLED = False

# The platform's webhook receiver: http(s)://<one of these hosts>:<one of these ports>
# /hooks/label-studio/<id>/ ("*" for any port: a test run's receivers).
PLATFORM_WEBHOOK_PORTS = [
    p.strip() for p in os.environ.get("PLATFORM_WEBHOOK_PORTS", "8000").split(",") if p.strip()
]
PLATFORM_WEBHOOK_HOSTS = [
    h.strip()
    for h in os.environ.get("PLATFORM_WEBHOOK_HOSTS", "127.0.0.1,localhost").split(",")
    if h.strip()
]
