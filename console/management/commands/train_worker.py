"""``manage.py train_worker``: this node's train worker.

Finds the node's devices (the hardware probe in the runtime venv, or PLATFORM_DEVICES),
registers the node with them, then becomes a Celery worker on exactly the queues of those
devices, one job slot per device. The worker beats for the node while it runs (console/celery.py).
"""

import json
import os
import socket
import sys
from dataclasses import asdict

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from console import hardware, services


class Command(BaseCommand):
    help = "Detect this node's devices, register the node, and run its train worker."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--loglevel", default="INFO")
        parser.add_argument(
            "--register-only",
            action="store_true",
            help="Detect and register the node, print its devices, and exit.",
        )

    def handle(self, *args, loglevel: str, register_only: bool, **options) -> None:
        if os.geteuid() == 0:
            # Root only to start runners as PLATFORM_RUNNER_USER (runtime/sandbox.py): what
            # it writes to the data directory stays the platform group's to change as well.
            os.umask(0o007)
        if settings.NODE_DEVICES:
            try:
                devices = hardware.parse_devices(settings.NODE_DEVICES)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            facts, simulated = {"declared": settings.NODE_DEVICES}, True
        else:
            facts = hardware.probe(settings.TRAINING_PYTHON)
            devices = hardware.devices_from_probe(facts, settings.NODE_CPU_SLOTS)
            simulated = False
            if "error" in facts:
                self.stderr.write(f"{facts['error']}; this node offers its CPU only.")
        node = services.node_register(
            name=settings.NODE_NAME,
            devices=devices,
            simulated=simulated,
            facts=facts,
            address=settings.NODE_ADDRESS or own_address(),
        )
        kinds = ", ".join(f"{d.device_type}:{d.index} {d.name}".strip() for d in devices)
        note = " (declared by PLATFORM_DEVICES: jobs run on the CPU)" if simulated else ""
        self.stdout.write(
            f"node {node.name} at {node.address}{note}: {kinds}; queues {', '.join(node.queues)}"
        )
        if register_only:
            return
        argv = [sys.executable, "-m", "celery", "-A", "console", "worker"]
        # The device types' queues, and the node's own: its parts of jobs that span nodes.
        queues = [*node.queues, node.queue]
        argv += ["--queues", ",".join(queues), "--concurrency", str(len(devices))]
        argv += ["--hostname", f"train@{node.name}", "--loglevel", loglevel]
        sys.stdout.flush()
        # The worker process beats for this node (console/celery.py) under the same name.
        # Its devices go along: the heartbeat registers the node again if its row went away.
        env = {
            **os.environ,
            "PLATFORM_NODE_NAME": node.name,
            "PLATFORM_TRAIN_WORKER": "1",
            "PLATFORM_NODE_REGISTRATION": json.dumps(
                {
                    "devices": [asdict(d) for d in devices],
                    "simulated": simulated,
                    "address": node.address,
                }
            ),
        }
        os.execve(sys.executable, argv, env)


def own_address() -> str:
    """This machine's address as the other nodes would reach it: what its host name resolves
    to, or, where that is a loopback address (Debian's /etc/hosts), the address of the
    interface that routes outwards. PLATFORM_NODE_ADDRESS overrides both."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = "127.0.0.1"
    if not address.startswith("127."):
        return address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP: nothing is sent, a route is chosen
            return s.getsockname()[0]
        except OSError:
            return address  # no route out: a machine on its own
