"""Every setting of the platform, read from the environment in this one place.

Defaults run the whole platform on one machine with nothing configured: SQLite and files under
``var/``, and an embedded Redis on a loopback port (started by ``make run``).
"""

import functools
import socket
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from runtime import env, sandbox

BASE_DIR = Path(__file__).resolve().parent.parent
# Not upper-case: Django would take them for settings.
_Args = ParamSpec("_Args")
_Value = TypeVar("_Value")


def _improperly_configured(read: Callable[_Args, _Value]) -> Callable[_Args, _Value]:
    """``read``, with a bad value refused as Django refuses a setting (the message names the
    variable and the value)."""

    @functools.wraps(read)
    def wrapped(*args: _Args.args, **kwargs: _Args.kwargs) -> _Value:
        try:
            return read(*args, **kwargs)
        except env.EnvError as exc:
            raise ImproperlyConfigured(f"environment variable {exc}") from None

    return wrapped


# Every variable below is read through these (runtime/env.py) and listed in the README's table.
env_str = _improperly_configured(env.env_str)
env_int = _improperly_configured(env.env_int)
env_float = _improperly_configured(env.env_float)
env_bool = _improperly_configured(env.env_bool)
env_list = _improperly_configured(env.env_list)
env_path = _improperly_configured(env.env_path)


# The insecure default only serves DEBUG; without DEBUG the platform refuses to start with it.
DEFAULT_SECRET_KEY = "insecure-default-key-for-debug-only"  # noqa: S105

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", DEFAULT_SECRET_KEY)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")

if not DEBUG:
    if SECRET_KEY == DEFAULT_SECRET_KEY:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: with DEBUG off the platform refuses the default secret. "
            "Set SECRET_KEY to a long random value (make run generates one in var/secret_key)."
        )
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS is empty: with DEBUG off set it to the host names the console is "
            "served under, comma-separated."
        )

CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")
# Behind a TLS proxy that sets X-Forwarded-Proto (platform/nginx/): requests are HTTPS. Only
# where the proxy is the sole way in; a client reaching Django directly could claim HTTPS.
BEHIND_TLS_PROXY = env_bool("BEHIND_TLS_PROXY", False)
if BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The proxies (addresses or networks) whose X-Forwarded-For names the client: the audit log and
# the login lockout take the client's address from it only for a request that came from one of
# them (console.middleware.request_ip). Behind platform/nginx/ on the same machine: loopback.
TRUSTED_PROXIES = env_list("PLATFORM_TRUSTED_PROXIES", "127.0.0.1,::1" if BEHIND_TLS_PROXY else "")

DATA_DIR = env_path("PLATFORM_DATA_DIR", BASE_DIR / "var").resolve()

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "axes",
    "django_prometheus",
    "console",
    "labeling",
    "training",
    "deployment",
]

MIDDLEWARE = [
    # First and last: Django's request figures for /metrics (django-prometheus).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.middleware.RequestContextMiddleware",
    # Turns a lockout (too many failed logins or unknown tokens) into its answer.
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'platform.sqlite3'}"),
        conn_max_age=60,
        # A kept connection is checked before a request uses it: after the database restarted,
        # the first request reconnects instead of failing.
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes write (web, workers, a job's supervisor twice a second): transactions
    # take the write lock at their start, so that none fails at once upgrading a read lock, and
    # wait for it rather than give up after SQLite's 5 s.
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 30}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Password guessing (django-axes, console/lockout.py): LOGIN_FAILURE_LIMIT failed logins for one
# account (from any address), or from one address (for any accounts, unknown API tokens
# included), within LOGIN_LOCKOUT_MINUTES lock that account or address out for
# LOGIN_LOCKOUT_MINUTES after the last failure; site staff can unlock it on the Accounts page.
AUTHENTICATION_BACKENDS = [
    "console.lockout.LockoutBackend",
    # The directory first, when LDAP_SERVER_URI is set; local accounts (break-glass site
    # staff) after it. A directory entry never logs in as a local account of its name.
    "console.directory.DirectoryBackend",
    # Single sign-on's callback (OIDC_ISSUER); it answers nothing else.
    "console.oidc.OIDCBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5, min=1)
LOGIN_LOCKOUT_MINUTES = env_float("LOGIN_LOCKOUT_MINUTES", 15.0, min=0)
AXES_FAILURE_LIMIT = "console.lockout.failure_limit"
AXES_COOLOFF_TIME = "console.lockout.cool_off"
AXES_LOCKOUT_PARAMETERS = "console.lockout.lockout_parameters"
AXES_CLIENT_IP_CALLABLE = "console.middleware.request_ip"
AXES_LOCKOUT_CALLABLE = "console.lockout.lockout_response"
# A try while locked out is refused without extending the lockout: the time it names holds.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# Logins are in the platform's own audit log already.
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False

# Login with the enterprise's directory (console/directory.py, django-auth-ldap): off while
# LDAP_SERVER_URI is empty. ldap://host (StartTLS with LDAP_START_TLS) or ldaps://host; the
# server's certificate is checked against LDAP_CA_FILE (else the system's CAs).
# Search-then-bind (LDAP_USER_SEARCH_BASE and LDAP_USER_FILTER, as LDAP_BIND_DN) or a direct
# bind (LDAP_USER_DN_TEMPLATE). Disabled people must not match LDAP_USER_FILTER (Active
# Directory: add (!(userAccountControl:1.2.840.113556.1.4.803:=2))).
LDAP_SERVER_URI = env_str("LDAP_SERVER_URI", "")
LDAP_START_TLS = env_bool("LDAP_START_TLS", False)
LDAP_BIND_DN = env_str("LDAP_BIND_DN", "")
LDAP_BIND_PASSWORD = env_str("LDAP_BIND_PASSWORD", "")
LDAP_CA_FILE = env_str("LDAP_CA_FILE", "")
LDAP_USER_SEARCH_BASE = env_str("LDAP_USER_SEARCH_BASE", "")
LDAP_USER_FILTER = env_str("LDAP_USER_FILTER", "(uid=%(user)s)")
LDAP_USER_DN_TEMPLATE = env_str("LDAP_USER_DN_TEMPLATE", "")
# Groups: where they are and their kind (groupOfNames, groupOfUniqueNames, posixGroup,
# activeDirectory; nested-groupOfNames and nested-activeDirectory follow groups in groups).
LDAP_GROUP_SEARCH_BASE = env_str("LDAP_GROUP_SEARCH_BASE", "")
LDAP_GROUP_TYPE = env_str("LDAP_GROUP_TYPE", "nested-groupOfNames")
# Directory groups → teams and roles, JSON: {"cn=nlp-engineers,ou=groups,dc=example,dc=com":
# "nlp:maintainer"}; members of LDAP_STAFF_GROUP are site staff.
LDAP_TEAM_MAP = env_str("LDAP_TEAM_MAP", "{}")
LDAP_STAFF_GROUP = env_str("LDAP_STAFF_GROUP", "")
# The directory's attributes copied to the account at every login and sync.
LDAP_USER_ATTR_MAP = {
    "first_name": env_str("LDAP_ATTR_FIRST_NAME", "givenName"),
    "last_name": env_str("LDAP_ATTR_LAST_NAME", "sn"),
    "email": env_str("LDAP_ATTR_EMAIL", "mail"),
}
LDAP_ATTR_DISPLAY_NAME = env_str("LDAP_ATTR_DISPLAY_NAME", "displayName")
# Every LDAP_SYNC_MINUTES the directory is read again for each account it provides: disabled
# or removed people are deactivated, group changes applied (0: no sync).
LDAP_SYNC_MINUTES = env_float("LDAP_SYNC_MINUTES", 15.0, min=0)

# Single sign-on with OpenID Connect (console/oidc.py, mozilla-django-oidc): off while
# OIDC_ISSUER is empty. The provider's endpoints come from its discovery document; the code
# flow uses PKCE and a nonce, the ID token's signature (OIDC_SIGN_ALGO), issuer and audience are
# checked. Register <platform>/oidc/callback/ as the redirect URI and <platform>/login/ as the
# post-logout one. TLS to the provider is checked against OIDC_CA_FILE (else the system's CAs).
OIDC_ISSUER = env_str("OIDC_ISSUER", "").rstrip("/")
OIDC_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_SCOPES = env_str("OIDC_SCOPES", "openid email profile groups")
OIDC_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_CA_FILE = env_str("OIDC_CA_FILE", "")
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
# The provider's groups → teams and roles, JSON: {"nlp-engineers": "nlp:maintainer"}, applied
# at every login; members of OIDC_STAFF_GROUP are site staff.
OIDC_TEAM_MAP = env_str("OIDC_TEAM_MAP", "{}")
OIDC_STAFF_GROUP = env_str("OIDC_STAFF_GROUP", "")
# The login page's button: "Log in with <OIDC_PROVIDER_NAME>" (e.g. 统一身份认证).
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "")

LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "console:login"

LANGUAGE_CODE = "zh-hans"
LANGUAGES = [("zh-hans", "简体中文"), ("en", "English")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "Asia/Shanghai"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
MEDIA_ROOT = DATA_DIR / "media"

# Files of the platform (dataset versions, reports, originals) go through Django's storage API:
# the filesystem under PLATFORM_DATA_DIR by default, an S3-compatible store (MinIO…) with
# STORAGE_BACKEND=s3 and the AWS_* variables of django-storages.
STORAGE_BACKEND = env_str("STORAGE_BACKEND", "filesystem")
if STORAGE_BACKEND not in {"filesystem", "s3"}:
    raise ImproperlyConfigured(
        f"environment variable STORAGE_BACKEND={STORAGE_BACKEND!r}: set it to filesystem or s3."
    )
if STORAGE_BACKEND == "s3":
    STORAGES["default"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env_str("AWS_STORAGE_BUCKET_NAME", required=True),
            # None, not "": django-storages then looks for them as boto3 does.
            "endpoint_url": env_str("AWS_S3_ENDPOINT_URL") or None,
            "access_key": env_str("AWS_ACCESS_KEY_ID") or None,
            "secret_key": env_str("AWS_SECRET_ACCESS_KEY") or None,
            "file_overwrite": False,
        },
    }

# Chunked, resumable uploads: chunks land in a local staging directory (shared between web
# processes of one machine) until the file is complete, then move into storage.
UPLOAD_STAGING_DIR = env_path("PLATFORM_UPLOAD_DIR", DATA_DIR / "uploads")
UPLOAD_MAX_BYTES = int(env_float("PLATFORM_UPLOAD_MAX_MB", 2048, min=0) * 1024 * 1024)
UPLOAD_CHUNK_BYTES = 4 * 1024 * 1024
# An upload not completed, or completed and never imported, is deleted (file and row) this many
# hours after it began (beat: labeling.tasks.expire_uploads).
UPLOAD_EXPIRY_HOURS = env_float("UPLOAD_EXPIRY_HOURS", 24.0, min=0)
# What a team may keep in the platform's storage (uploads, its base models, model versions), in
# GB; a team's own quota (Team.storage_quota_gb) overrides it. 0: no limit.
TEAM_STORAGE_QUOTA_GB = env_float("TEAM_STORAGE_QUOTA_GB", 500.0, min=0)
# XLSX is a zip of XML: a few kilobytes can expand to gigabytes (a zip bomb). Before openpyxl
# reads a workbook, a member that expands more than XLSX_MAX_COMPRESSION_RATIO times (above
# 100 KiB; Apache POI's ZipSecureFile default, a minimum inflate ratio of 0.01) or members that
# expand to more than XLSX_MAX_UNCOMPRESSED_BYTES together refuse the file. Real sheets of text
# compress 5 to 20 times.
XLSX_MAX_COMPRESSION_RATIO = env_int("PLATFORM_XLSX_MAX_COMPRESSION_RATIO", 100, min=1)
XLSX_MAX_UNCOMPRESSED_BYTES = int(
    env_float("PLATFORM_XLSX_MAX_UNCOMPRESSED_MB", 4096, min=0) * 1024 * 1024
)
# Serve straight from the apps' static folders when collectstatic has not run (tests, DEBUG).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Cookies ignore ports: Label Studio on the same host (another port) uses Django's default
# names, so the platform's have names of their own or each would log the other out.
SESSION_COOKIE_NAME = "platform_sessionid"
CSRF_COOKIE_NAME = "platform_csrftoken"
SESSION_COOKIE_HTTPONLY = True
# Served over HTTPS (BEHIND_TLS_PROXY), cookies go over HTTPS only. Not by default: over plain
# HTTP (make run on a LAN address) a browser would drop Secure cookies and no one could log in.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", BEHIND_TLS_PROXY)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"

# -- Redis and Celery ------------------------------------------------------------------------

# The embedded Redis of `make run` listens here when REDIS_URL is not set.
EMBEDDED_REDIS_PORT = env_int("PLATFORM_REDIS_PORT", 6380, min=1, max=65535)
REDIS_URL = env_str("REDIS_URL", f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0")

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
# Long tasks: acknowledge only when done, and put a task back when its worker dies mid-way.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Run tasks in the calling process (benchmarks, a machine without workers); never in production.
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# A task not acknowledged within this time is redelivered; longer than any job's heartbeat gap.
# Priorities: each queue is several Redis lists, read most urgent first (0 is the highest).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 6 * 3600,
    "priority_steps": list(range(10)),
    "queue_order_strategy": "priority",
    "sep": ":",
}
CELERY_TASK_DEFAULT_PRIORITY = 5
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")

# -- Nodes -----------------------------------------------------------------------------------

# This node's name in the registry (default: the host name); a train worker registers it with
# its devices (`manage.py train_worker`) and beats every NODE_HEARTBEAT_S seconds.
NODE_NAME = env_str("PLATFORM_NODE_NAME") or socket.gethostname()
# Declared devices instead of detected ones, e.g. `npu:2` or `cpu:1,gpu:4`: a simulated node
# whose jobs run on the CPU underneath (tests, demonstrations). Empty: detect.
NODE_DEVICES = env_str("PLATFORM_DEVICES")
# Where the other nodes reach this one: the rendezvous of a job that spans several nodes.
NODE_ADDRESS = env_str("PLATFORM_NODE_ADDRESS")
# CPU jobs one node runs at once (its CPU "slots") when devices are detected.
NODE_CPU_SLOTS = env_int("PLATFORM_CPU_SLOTS", 1, min=1)
NODE_HEARTBEAT_S = env_float("PLATFORM_NODE_HEARTBEAT_S", 15.0, min=0.1)
# The worker detects its devices again this often (a card that failed or came back); 0: never.
NODE_REDETECT_S = env_float("PLATFORM_NODE_REDETECT_S", 600.0, min=0)
# A node that has not beaten for this long is shown as stopped; its jobs wait for others.
NODE_STALE_S = env_float("PLATFORM_NODE_STALE_S", 60.0, min=0)

# -- Training --------------------------------------------------------------------------------

# The job runner runs in its own venv (Paddle and torch need numpy 1.x; the console's Label
# Studio SDK needs numpy 2): `make run` and `make test` install it into .venv-runtime.
TRAINING_PYTHON = env_str("TRAINING_PYTHON", str(BASE_DIR / ".venv-runtime/bin/python"))
# Where the platform runs as root, job runners (and the serving host's predictors, which read
# the same variable) run as this unprivileged user; empty: model-platform-runner if the machine
# has it, else nobody (runtime/sandbox.py). Not root: they run as the platform's own user.
PLATFORM_RUNNER_USER = env_str("PLATFORM_RUNNER_USER")
# Each job attempt (and each revision on the serving host, which reads the same variable) runs
# as a uid of its own from this base on (16.8M uids, no passwd entry needed), in
# PLATFORM_RUNNER_USER's group; empty or 0: all run as PLATFORM_RUNNER_USER (weaker).
PLATFORM_RUNNER_UID_BASE = env_int(
    "PLATFORM_RUNNER_UID_BASE", sandbox.DEFAULT_UID_BASE, min=0, empty=0
)
# Work directories of jobs (data, checkpoints, exports): local or shared (NFS) disk.
TRAINING_WORK_DIR = env_path("TRAINING_WORK_DIR", DATA_DIR / "training")
# Jobs of one team that may run at once, whatever the number of workers.
TRAINING_TEAM_CONCURRENCY = env_int("TRAINING_TEAM_CONCURRENCY", 2, min=1)
# Jobs one user may have queued or running at once, over all their teams (a user in several
# teams does not get several teams' share); a job beyond it is refused at submission.
TRAINING_MAX_CONCURRENT_PER_USER = env_int("TRAINING_MAX_CONCURRENT_PER_USER", 4, min=1)
# The longest a job may run, in hours from its start: its worker stops it and fails it past
# that. A job may ask for less (max_hours), not more.
TRAINING_MAX_HOURS = env_float("TRAINING_MAX_HOURS", 72.0, min=0)
# Prometheus's /metrics (console and serving hosts): with a token, only a scrape that presents
# it (Authorization: Bearer); without, only from these networks (comma-separated).
METRICS_TOKEN = env_str("PLATFORM_METRICS_TOKEN")
METRICS_ALLOW = env_str("PLATFORM_METRICS_ALLOW") or "127.0.0.1/32,::1/128"
# How often a running job's worker checks its team's device-hour quota (seconds): once it is
# used, the job pauses at the end of its epoch with a checkpoint and resumes when quota returns.
TRAINING_QUOTA_CHECK_S = env_int("TRAINING_QUOTA_CHECK_S", 60, min=1)
# A job whose worker was lost this many times fails instead of starting again.
TRAINING_MAX_ATTEMPTS = env_int("TRAINING_MAX_ATTEMPTS", 3, min=1)
# A job that spans nodes fails when its parts have not met (and started training) this soon.
TRAINING_RENDEZVOUS_TIMEOUT_S = env_int("TRAINING_RENDEZVOUS_TIMEOUT_S", 300, min=1)
# Base models are imported from directories or archives under this directory of the server
# (and from archives uploaded through the console).
MODEL_IMPORT_DIR = env_path("PLATFORM_MODEL_IMPORT_DIR", DATA_DIR / "imports")
# Model archives (base models, model versions) are refused before extraction when they hold
# more members than this, expand past this size in all, or expand more than this many times
# their packed size (zip bombs); weights compress little, so real archives stay far below.
ARCHIVE_MAX_MEMBERS = env_int("PLATFORM_ARCHIVE_MAX_MEMBERS", 10000, min=1)
ARCHIVE_MAX_UNCOMPRESSED_BYTES = int(
    env_float("PLATFORM_ARCHIVE_MAX_UNCOMPRESSED_MB", 262144, min=0) * 1024 * 1024
)
ARCHIVE_MAX_COMPRESSION_RATIO = env_int("PLATFORM_ARCHIVE_MAX_COMPRESSION_RATIO", 100, min=1)

# -- Deployment ------------------------------------------------------------------------------

# The serving hosts (python -m serving, one per node) the reconciler keeps in step
# with the endpoints in the database, and the secret of their management API. `make run`
# starts one on SERVING_PORT and generates the secret once (var/serving_secret).
SERVING_PORT = env_int("SERVING_PORT", 8300, min=1, max=65535)
SERVING_HOSTS = [
    url.rstrip("/") for url in env_list("SERVING_HOSTS", f"http://127.0.0.1:{SERVING_PORT}")
]
SERVING_SECRET = env_str("SERVING_SECRET")
# Where applications call endpoints (a load balancer in front of several hosts).
SERVING_PUBLIC_URL = env_str("SERVING_PUBLIC_URL", SERVING_HOSTS[0]).rstrip("/")
# Endpoints' request metrics are kept this many days.
SERVING_METRICS_RETENTION_DAYS = env_int("SERVING_METRICS_RETENTION_DAYS", 30, min=1)
# Local copies of exports for hosts on this machine when storage is not a filesystem (S3).
SERVING_CACHE_DIR = env_path("SERVING_CACHE_DIR", DATA_DIR / "serving")

# -- Label Studio --------------------------------------------------------------------------

# The Label Studio server and the platform's token for it: given, or the one `make run` starts
# (its token is written to the token file once Label Studio is up).
LABEL_STUDIO_URL = env_str("LABEL_STUDIO_URL").rstrip("/")
LABEL_STUDIO_TOKEN = env_str("LABEL_STUDIO_TOKEN")
# Annotators' Label Studio accounts are u<id>@ this domain.
LABEL_STUDIO_ACCOUNT_DOMAIN = env_str("LABEL_STUDIO_ACCOUNT_DOMAIN", "annotators.platform.local")
# The platform's own URL as Label Studio reaches it, for webhooks.
PLATFORM_URL = env_str("PLATFORM_URL", "http://127.0.0.1:8000").rstrip("/")
LABEL_STUDIO_TOKEN_FILE = env_path(
    "LABEL_STUDIO_TOKEN_FILE", DATA_DIR / "label-studio" / "platform-token"
)
# Teams' organisations and annotators' accounts are managed through Label Studio's own Django
# (platform/label_studio_ext/platform_ls/manage.py): by default run here with Label Studio's
# venv on its data directory; for a Label Studio on another host, a command that runs
# `python -m platform_ls.manage` there (e.g. over ssh), reading JSON on stdin.
LABEL_STUDIO_DATA_DIR = env_path("LABEL_STUDIO_DATA_DIR", DATA_DIR / "label-studio").resolve()
LABEL_STUDIO_ADMIN_COMMAND = env_str("LABEL_STUDIO_ADMIN_COMMAND")
# Changes of the team a user labels in, per user and hour (each is a run of Label Studio's
# Django, and those runs take turns: labeling/label_studio.py).
LABEL_STUDIO_SWITCHES_PER_HOUR = env_int("LABEL_STUDIO_SWITCHES_PER_HOUR", 30, min=1)

# -- REST API --------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # At most 1000 a page, whatever ?limit= asks (console/pagination.py).
    "DEFAULT_PAGINATION_CLASS": "console.pagination.ApiPagination",
    "PAGE_SIZE": 50,
}
# Personal API tokens expire after this many days unless their creator chooses otherwise
# ("never" included, explicitly). 90 days: a token forgotten in a script or a CI secret stops
# working within a quarter, the rotation period most enterprise security policies ask for,
# while a token in daily use is renewed rarely. 0 makes "never" the default.
API_TOKEN_DEFAULT_DAYS = env_int("API_TOKEN_DEFAULT_DAYS", 90, min=0)
# The choices offered at creation, in days.
API_TOKEN_EXPIRY_CHOICES_DAYS = (7, 30, 90, 365)
# Who may create teams: "staff" (site administrators) or "any" (every signed-in account).
PLATFORM_TEAM_CREATION = env_str("PLATFORM_TEAM_CREATION", "staff").strip().lower()
if PLATFORM_TEAM_CREATION not in {"staff", "any"}:
    raise ImproperlyConfigured(
        f"PLATFORM_TEAM_CREATION is {PLATFORM_TEAM_CREATION!r}: set it to staff or any."
    )
SPECTACULAR_SETTINGS = {
    "TITLE": "Model Platform API",
    "DESCRIPTION": "REST API of the private model platform. Authenticate with a personal API "
    "token: `Authorization: Bearer <token>`. Team-scoped routes live under /api/v1/teams/<team>/.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The error answers of every operation (console.openapi); the enum hook is the default.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.openapi.document_errors",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO").upper()},
    # django-axes logs every login at INFO; its failures and lockouts are warnings.
    "loggers": {"axes": {"level": "WARNING"}},
}

# -- Notifications (console/notifications.py) ------------------------------------------------

# Email: Django's SMTP settings.
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, min=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = 15
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "model-platform@localhost")
# How the platform names itself in the subjects of its emails.
PLATFORM_NAME = env_str("PLATFORM_NAME", "私有化模型平台")
# The only hosts (host or host:port) group robots are reached at: their public addresses, or
# the site's relay in an air-gapped network. A team's owner cannot point one elsewhere.
NOTIFY_ROBOT_HOSTS = env_list(
    "NOTIFY_ROBOT_HOSTS", "oapi.dingtalk.com,qyapi.weixin.qq.com,open.feishu.cn,open.larksuite.com"
)
# A delivery that failed is tried again after this many seconds, doubling, four times.
NOTIFY_RETRY_S = env_int("NOTIFY_RETRY_S", 30, min=1)

# -- Backups (console/backup.py) --------------------------------------------------------------

# Where beat's nightly backup writes its archives (nothing nightly when empty), at this hour
# (local time), keeping this many.
BACKUP_DIR = env_str("BACKUP_DIR")
BACKUP_HOUR = env_int("BACKUP_HOUR", 2, min=0, max=23)
BACKUP_KEEP = env_int("BACKUP_KEEP", 7, min=1)
