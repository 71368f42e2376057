"""The platform's Label Studio: the real server, in its own virtual environment.

``serve`` runs it in the foreground for the Procfile of ``make run`` and, once it answers, makes
sure the platform has an API token for it (written to the token file, mode 0600).
``run -- CMD`` runs CMD with ``LABEL_STUDIO_URL`` and ``LABEL_STUDIO_TOKEN`` pointing at a
Label Studio: the one configured, or one started on a free loopback port with a data
directory of its own for CMD's lifetime (``make test``).

Label Studio pins its own Django, so it never shares the platform's venv: its executable is
``.venv-labelstudio/bin/label-studio`` (``LABEL_STUDIO_BIN`` to override). Facts of 1.23.2:
``--internal-host`` is the bind address (``--host`` only sets the public URL); the data
directory comes from ``LABEL_STUDIO_BASE_DATA_DIR``; the callouts (version check, Sentry,
analytics) are switched off here.

Label Studio runs with the platform's settings module, ``platform_ls.settings`` (in
``platform/label_studio_ext/``): a project is reachable by its organisation's members only, the
private-address guard is on for every account except towards the platform's own webhook
receiver (``PLATFORM_WEBHOOK_HOSTS``, the host of ``PLATFORM_URL`` by default), and nobody signs
up without an invite link. ``python -m platform_ls.manage``, run with the same environment
(``admin_env``), is how the platform creates a team's organisation and moves accounts.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADMIN_EMAIL = os.environ.get("LABEL_STUDIO_USERNAME", "platform@example.com")
START_TIMEOUT_S = 180  # the first start migrates its database: about 25-50 s here


def binary() -> str:
    path = os.environ.get("LABEL_STUDIO_BIN") or str(ROOT / ".venv-labelstudio/bin/label-studio")
    if not Path(path).exists():
        raise SystemExit(f"Label Studio is not installed at {path}: run `make labelstudio`.")
    return path


EXTENSION_DIR = ROOT / "platform" / "label_studio_ext"


# What Label Studio gets of the platform's environment: the system's basics, its database and
# its own LABEL_STUDIO_* settings; never the platform's secrets (SECRET_KEY, SERVING_SECRET,
# REDIS_URL, AWS_*: Label Studio's S3 storage falls back to AWS_* variables, so an account could
# list the platform's bucket through an import storage made with empty keys).
ENV_NAMES = frozenset(
    "PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR SSL_CERT_FILE SSL_CERT_DIR "
    "REQUESTS_CA_BUNDLE DJANGO_DB PLATFORM_WEBHOOK_HOSTS PLATFORM_WEBHOOK_PORTS".split()
)
ENV_PREFIXES = ("LC_", "LABEL_STUDIO_", "POSTGRE_", "MYSQL_")
# The platform's own LABEL_STUDIO_* settings (its token, where it finds Label Studio): not for
# Label Studio; the admin's credentials are server_env's to add.
ENV_PLATFORM_ONLY = frozenset(
    "LABEL_STUDIO_URL LABEL_STUDIO_TOKEN LABEL_STUDIO_TOKEN_FILE LABEL_STUDIO_DATA_DIR "
    "LABEL_STUDIO_ADMIN_COMMAND LABEL_STUDIO_ACCOUNT_DOMAIN LABEL_STUDIO_BIN "
    "LABEL_STUDIO_USERNAME LABEL_STUDIO_PASSWORD".split()
)


def _url_port(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return str(parts.port or (443 if parts.scheme == "https" else 80))


def admin_env(data_dir: Path, environ: dict | None = None) -> dict:
    """Label Studio's environment without the admin's credentials: for the server and for
    ``python -m platform_ls.manage`` alike. An allowlist of the platform's environment
    (``ENV_NAMES``, ``ENV_PREFIXES``), nothing else of it."""
    environ = dict(os.environ if environ is None else environ)
    platform_url = environ.get("PLATFORM_URL", "http://127.0.0.1:8000")
    kept = {
        k: v
        for k, v in environ.items()
        if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and k not in ENV_PLATFORM_ONLY
    }
    env = {
        **kept,
        "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "platform_ls.settings",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(EXTENSION_DIR), environ.get("PYTHONPATH", "")) if p
        ),
        # Host names, not resolved by a DNS an attacker could answer: loopback's own names.
        "PLATFORM_WEBHOOK_HOSTS": environ.get("PLATFORM_WEBHOOK_HOSTS")
        or ",".join(
            dict.fromkeys(
                [urllib.parse.urlsplit(platform_url).hostname or "", "127.0.0.1", "localhost"]
            )
        ).strip(","),
        # …and on the port of PLATFORM_URL only ("*": any, for a test run's receivers).
        "PLATFORM_WEBHOOK_PORTS": environ.get("PLATFORM_WEBHOOK_PORTS") or _url_port(platform_url),
        "DISABLE_SIGNUP_WITHOUT_LINK": "true",
        "LATEST_VERSION_CHECK": "false",
        "SENTRY_DSN": "",
        "FRONTEND_SENTRY_DSN": "",
        "COLLECT_ANALYTICS": "false",
    }
    # Its own database and secret, not the platform's; the guard is not for switching off.
    for name in ("DATABASE_URL", "SECRET_KEY", "DEBUG", "USE_DEFAULT_BANNED_SUBNETS"):
        env.pop(name, None)
    return env


def server_env(data_dir: Path, password: str) -> dict:
    return {
        **admin_env(data_dir),
        "LABEL_STUDIO_USERNAME": ADMIN_EMAIL,
        "LABEL_STUDIO_PASSWORD": password,
    }


def start(
    port: int, data_dir: Path, password: str, log, webhook_ports: str = ""
) -> subprocess.Popen:
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        binary(),
        "start",
        "--internal-host",
        "127.0.0.1",
        "--port",
        str(port),
        "--host",
        f"http://127.0.0.1:{port}",
        "--no-browser",
    ]
    env = server_env(data_dir, password)
    if webhook_ports:
        env["PLATFORM_WEBHOOK_PORTS"] = webhook_ports
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=log)


def wait_until_up(url: str, proc: subprocess.Popen | None, timeout: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"Label Studio exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if json.loads(r.read()).get("status") == "UP":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(1)
    raise SystemExit(f"Label Studio did not answer at {url}/health within {timeout:.0f} s")


def create_token(url: str, password: str) -> str:
    """Log in as the platform's Label Studio admin and create its personal access token.

    Label Studio shows a personal access token only when it creates it, and refuses a second
    one while the first is valid: the caller keeps it (the token file)."""
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def csrf() -> str:
        return next(c.value for c in jar if c.name == "csrftoken")

    opener.open(f"{url}/user/login/", timeout=10)
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": csrf(), "email": ADMIN_EMAIL, "password": password}
    ).encode()
    login = urllib.request.Request(
        f"{url}/user/login/", data=form, headers={"Referer": f"{url}/user/login/"}
    )
    opener.open(login, timeout=10)
    if not any(c.name == "sessionid" for c in jar):
        raise SystemExit("Could not log in to Label Studio as the platform's admin.")
    request = urllib.request.Request(
        f"{url}/api/token/",
        data=b"",
        method="POST",
        headers={"X-CSRFToken": csrf(), "Referer": f"{url}/"},
    )
    try:
        with opener.open(request, timeout=10) as r:
            return json.loads(r.read())["token"]
    except urllib.error.HTTPError as exc:
        raise SystemExit(
            f"Label Studio refused a new token ({exc.code}: {exc.read()[:200]!r}); the token "
            "file was lost: set LABEL_STUDIO_TOKEN, or start over with an empty data directory."
        ) from exc


def ensure_token(url: str, password: str, token_file: Path) -> str:
    if token_file.exists():
        return token_file.read_text().strip()
    token = create_token(url, password)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.touch(mode=0o600)
    token_file.write_text(token + "\n")
    return token


def admin_password(data_dir: Path) -> str:
    """The password of the platform's Label Studio admin, generated once per data directory."""
    import secrets

    path = data_dir / "platform-admin-password"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(18))
    return path.read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, data_dir: Path, token_file: Path) -> None:
    password = admin_password(data_dir)
    proc = start(port, data_dir, password, None)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc)
        ensure_token(url, password, token_file)
        print(f"Label Studio ready at {url}", flush=True)
        sys.exit(proc.wait())
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def run(command: list[str]) -> int:
    if os.environ.get("LABEL_STUDIO_URL"):
        return subprocess.call(command)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="platform-labelstudio-") as tmp:
        data_dir, port = Path(tmp), free_port()
        password = admin_password(data_dir)
        with open(data_dir / "server.log", "wb") as log:
            # A test run's receivers (its live server, its recorders) listen on ports chosen
            # as it runs: any port, for this throwaway Label Studio only.
            ports = os.environ.get("PLATFORM_WEBHOOK_PORTS") or "*"
            proc = start(port, data_dir, password, log, webhook_ports=ports)
            try:
                url = f"http://127.0.0.1:{port}"
                began = time.monotonic()
                wait_until_up(url, proc)
                token = create_token(url, password)
                print(
                    f"Label Studio for this run at {url} (up in {time.monotonic() - began:.0f} s)",
                    file=sys.stderr,
                )
                env = {
                    **os.environ,
                    "LABEL_STUDIO_URL": url,
                    "LABEL_STUDIO_TOKEN": token,
                    # Where the platform runs platform_ls.manage for this Label Studio.
                    "LABEL_STUDIO_DATA_DIR": str(data_dir),
                }
                return subprocess.call(command, env=env)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python platform/label_studio.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve", help="run Label Studio in the foreground")
    p_serve.add_argument("--port", type=int, default=int(os.environ.get("LABEL_STUDIO_PORT", 8090)))
    p_serve.add_argument("--data-dir", type=Path, required=True)
    p_serve.add_argument("--token-file", type=Path, required=True)
    p_run = sub.add_parser("run", help="run a command with LABEL_STUDIO_URL and _TOKEN set")
    p_run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.cmd == "serve":
        serve(args.port, args.data_dir, args.token_file)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs a command")
    sys.exit(run(command))


if __name__ == "__main__":
    main()
