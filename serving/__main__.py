"""``python -m serving [--host H] [--port P] [--devices cpu]``: one serving host.

The shared secret of the management API comes from ``SERVING_SECRET`` (never a flag: flags
show in the process list); the host refuses to start without one. ``SERVING_MAX_BODY_MB``
(``--max-body-mb``) is the largest request body it reads.
"""

import argparse
import os
import sys

import uvicorn

from serving.app import MAX_BODY_MB, create_app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving")
    parser.add_argument("--host", default=os.environ.get("SERVING_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SERVING_PORT", "8300")))
    parser.add_argument(
        "--devices",
        default=os.environ.get("SERVING_DEVICES", "cpu"),
        help="the device types this node serves, comma-separated (cpu, gpu, npu…)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        # A string default goes through type= too: a bad SERVING_MAX_BODY_MB is refused here.
        default=os.environ.get("SERVING_MAX_BODY_MB") or str(MAX_BODY_MB),
        help="the largest request body, in MB (SERVING_MAX_BODY_MB): a larger one gets 413 "
        "before it is read",
    )
    args = parser.parse_args(argv)
    if args.max_body_mb <= 0:
        parser.error(f"SERVING_MAX_BODY_MB must be a positive number, not {args.max_body_mb:g}")
    secret = os.environ.get("SERVING_SECRET", "")
    if not secret:
        print(
            "SERVING_SECRET is not set: the serving host needs the platform's shared secret",
            file=sys.stderr,
        )
        return 2
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    app = create_app(secret, devices, args.max_body_mb)
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
