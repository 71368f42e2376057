"""Network helpers of the runtime, shared by the serving host, the worker and the tests."""

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the loopback interface by default; ``""`` for every
    interface, where other nodes connect)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
