"""Label Studio's organisations and accounts, driven through Label Studio's own Django.

Label Studio 1.23.2's community edition has organisations (a user sees the projects of their
active organisation) but no API to create one or to move a user between them. The platform
runs ``python -m platform_ls.manage`` (``platform/label_studio_ext/platform_ls/manage.py``) with
Label Studio's Python and data directory, or ``LABEL_STUDIO_ADMIN_COMMAND`` for a Label Studio on
another host, and passes it JSON on stdin (passwords and tokens never appear in a command line).

Every team has its own organisation, owned by a service account ``team-<id>@<domain>`` whose
API token is derived from the platform's ``SECRET_KEY`` (never stored): the platform creates and
reads a team's projects with that token, so each call is scoped to that organisation, and no
shared account switches between organisations. An annotator's account is a member of the
organisations of the teams where they hold a labeling role, and of no other.
"""

import base64
import contextlib
import fcntl
import hashlib
import hmac
import importlib.util
import json
import logging
import shlex
import subprocess
from pathlib import Path

from django.conf import settings
from django.utils.translation import gettext as _

logger = logging.getLogger(__name__)

TIMEOUT_S = 180
ROOT = Path(settings.BASE_DIR)


class AdminError(RuntimeError):
    """Label Studio's administration command could not be run or failed."""


def _secret(purpose: str) -> bytes:
    return hmac.new(settings.SECRET_KEY.encode(), purpose.encode(), hashlib.sha256).digest()


def team_token(team_id: int) -> str:
    """The API token of a team's service account (Label Studio's token key: 40 characters)."""
    return _secret(f"label-studio-team-token:{team_id}").hex()[:40]


def account_password(user_id: int) -> str:
    """The password of a platform user's Label Studio account (never stored, never shown)."""
    return base64.urlsafe_b64encode(_secret(f"label-studio:{user_id}")).decode().rstrip("=")


def team_spec(team) -> dict:
    return {
        "id": team.pk,
        "title": f"{team.name} ({team.slug})"[:1000],
        "token": team_token(team.pk),
    }


def _local_command() -> tuple[list[str], dict]:
    spec = importlib.util.spec_from_file_location(
        "platform_label_studio", ROOT / "platform" / "label_studio.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    python = Path(module.binary()).with_name("python")
    return [str(python), "-m", "platform_ls.manage"], module.admin_env(
        settings.LABEL_STUDIO_DATA_DIR
    )


@contextlib.contextmanager
def _one_at_a_time(data_dir: Path | None):
    """Runs on Label Studio's SQLite database take turns, across this host's processes: two at
    once (a team's first push and its first sync) failed one with "database is locked". A
    Label Studio on another host (``LABEL_STUDIO_ADMIN_COMMAND``) runs on its own database."""
    try:
        lock = open(data_dir / ".platform-admin.lock", "a") if data_dir else None
    except OSError as exc:  # a data directory this process may not write: runs as before
        logger.warning("Label Studio's administration runs unserialised: %s", exc)
        lock = None
    if lock is None:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def run(ops: list[dict]) -> list[dict]:
    """Run ``ops`` in Label Studio's process; their results, in order."""
    import os

    local = None if settings.LABEL_STUDIO_ADMIN_COMMAND else settings.LABEL_STUDIO_DATA_DIR
    if settings.LABEL_STUDIO_ADMIN_COMMAND:
        command, env = shlex.split(settings.LABEL_STUDIO_ADMIN_COMMAND), dict(os.environ)
    else:
        try:
            command, env = _local_command()
        except SystemExit as exc:  # Label Studio is not installed here
            raise AdminError(str(exc)) from None
        if not (settings.LABEL_STUDIO_DATA_DIR / "label_studio.sqlite3").exists() and not env.get(
            "DJANGO_DB"
        ):
            raise AdminError(
                _(
                    "Label Studio's data directory %(dir)s has no database: set "
                    "LABEL_STUDIO_DATA_DIR to the one Label Studio runs with, or "
                    "LABEL_STUDIO_ADMIN_COMMAND for a Label Studio on another host."
                )
                % {"dir": settings.LABEL_STUDIO_DATA_DIR}
            )
    request = json.dumps({"domain": settings.LABEL_STUDIO_ACCOUNT_DOMAIN, "ops": ops})
    try:
        with _one_at_a_time(local):
            done = subprocess.run(
                command, input=request, capture_output=True, text=True, env=env, timeout=TIMEOUT_S
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AdminError(
            _("Label Studio's administration failed: %(error)s") % {"error": exc}
        ) from exc
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise AdminError(_("Label Studio's administration failed: %(error)s") % {"error": tail[0]})
    try:
        # Label Studio prints a few lines of its own before the answer, the last line.
        return json.loads(done.stdout.strip().splitlines()[-1])["results"]
    except (ValueError, KeyError, IndexError) as exc:
        raise AdminError(
            _("Label Studio's administration answered no JSON: %(out)s")
            % {"out": done.stdout[:200]}
        ) from exc


def team_ensure(team) -> dict:
    """The team's organisation and service account exist: {"organization", "user"}."""
    return run([{"op": "team", **team_spec(team)}])[0]


def member_set(*, email: str, password: str, name: str, teams: list, active) -> dict:
    """The account exists, is active and a member of exactly ``teams``' organisations, working
    in ``active``'s: {"user": LS user id, "active": team id}."""
    op = {
        "op": "member",
        "email": email,
        "password": password,
        "name": name,
        "teams": [team_spec(t) for t in teams],
        "active": active.pk,
    }
    return run([op])[0]


def revoke(email: str) -> bool:
    """Deactivated, out of every organisation, tokens deleted, sessions ended."""
    return run([{"op": "revoke", "email": email}])[0]["revoked"]


def end_sessions(email: str, password: str) -> bool:
    return run([{"op": "end_sessions", "email": email, "password": password}])[0]["ended"]


def converge(teams: list, accounts: list[dict]) -> dict:
    """The whole desired state: ``accounts`` = [{"email", "teams": [team id], "active"}]."""
    return run([{"op": "converge", "teams": [team_spec(t) for t in teams], "accounts": accounts}])[
        0
    ]
