"""``python -m deployment.server [--host H] [--port P] [--devices cpu]``: one serving host.

The shared secret of the management API comes from ``SERVING_SECRET`` (never a flag: flags
show in the process list); the host refuses to start without one.
"""

import argparse
import os
import sys

import uvicorn

from deployment.server.app import create_app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployment.server")
    parser.add_argument("--host", default=os.environ.get("SERVING_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SERVING_PORT", "8300")))
    parser.add_argument(
        "--devices",
        default=os.environ.get("SERVING_DEVICES", "cpu"),
        help="the device types this node serves, comma-separated (cpu, gpu, npu…)",
    )
    args = parser.parse_args(argv)
    secret = os.environ.get("SERVING_SECRET", "")
    if not secret:
        print(
            "SERVING_SECRET is not set: the serving host needs the platform's shared secret",
            file=sys.stderr,
        )
        return 2
    app = create_app(secret, [d.strip() for d in args.devices.split(",") if d.strip()])
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="info",
        timeout_graceful_shutdown=10,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
