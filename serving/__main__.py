"""``python -m serving [--host H] [--port P] [--devices cpu]``: one serving host.

The shared secret of the management API comes from ``SERVING_SECRET`` (never a flag: flags
show in the process list); the host refuses to start without one. ``SERVING_MAX_BODY_MB``
(``--max-body-mb``) is the largest request body it reads.
"""

import argparse
import sys

import uvicorn

from runtime.env import EnvError, env_float, env_int, env_list, env_str


def main(argv: list[str]) -> int:
    try:
        # The engines' variables are read as their module loads: a bad one stops the start too.
        from serving.app import create_app
        from serving.engines import engines
        from serving.host import MAX_BODY_MB

        engines()  # SERVING_ENGINE_COMMANDS

        bind = env_str("SERVING_HOST", "127.0.0.1")
        port = env_int("SERVING_PORT", 8300, min=1, max=65535)
        default_devices = ",".join(env_list("SERVING_DEVICES", "cpu"))
        max_body_mb = env_float("SERVING_MAX_BODY_MB", MAX_BODY_MB, min=0.001)
        secret = env_str("SERVING_SECRET")
    except EnvError as exc:
        print(f"python -m serving: environment variable {exc}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m serving")
    parser.add_argument("--host", default=bind, help="the address to listen on (SERVING_HOST)")
    parser.add_argument("--port", type=int, default=port, help="the port (SERVING_PORT)")
    parser.add_argument(
        "--devices",
        default=default_devices,
        help="the device types this node serves, comma-separated (cpu, gpu, npu…; SERVING_DEVICES)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=max_body_mb,
        help="the largest request body, in MB (SERVING_MAX_BODY_MB): a larger one gets 413 "
        "before it is read",
    )
    args = parser.parse_args(argv)
    if args.max_body_mb <= 0:
        parser.error(f"--max-body-mb must be a positive number, not {args.max_body_mb:g}")
    if not secret:
        print(
            "SERVING_SECRET is not set: the serving host needs the platform's shared secret",
            file=sys.stderr,
        )
        return 2
    from serving.transport import HostProtocol

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    app = create_app(secret, devices, args.max_body_mb)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http=HostProtocol,  # httptools', one write per answer (serving.transport)
        access_log=False,
        proxy_headers=False,  # nothing reads the client's address
        log_level="info",
        timeout_graceful_shutdown=10,
        # Longer than clients keep an idle connection (httpx and the openai client: 5 s, as
        # uvicorn's own default): a server that closes first races a client reusing it, which
        # then sees "Server disconnected without sending a response". nginx's 75 s.
        timeout_keep_alive=75,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
