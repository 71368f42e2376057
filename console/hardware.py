"""Device types, read from their profiles in ``platform/hardware/*.toml``: the one definition of
a device type's Paddle device string, visibility variable, Celery queue and how a node finds
it. Adding a device type is adding a profile.

A node's devices come from ``platform/hardware/probe.py`` (run with the runtime venv, where
Paddle and torch are), or from ``PLATFORM_DEVICES`` (``npu:2,cpu:1``), which declares them
instead: a simulated node, whose jobs run on the CPU underneath (tests, demonstrations).
"""

import json
import subprocess
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parent.parent / "platform" / "hardware"


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    label: str
    paddle_device: str
    paddle_package: str
    visibility_env: str
    # Which fact of the probe finds these devices: "cpu", "cuda", "rocm", "xpu", "custom:<type>".
    detect: str
    # One job may span several nodes of this type.
    multi_node: bool
    queue: str
    amp: bool
    bf16: bool
    # Tested on the platform's own machines (CPU), or declared from the vendor's documentation.
    tested: bool
    limits: tuple[str, ...] = field(default=())
    # The limits in other languages, by language code (a profile's ``[limits_i18n]`` table:
    # ``zh-hans = ["…"]``): profiles are the site's files, outside the message catalogue.
    limits_i18n: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)

    def shown_limits(self) -> tuple[str, ...]:
        """The limits in the active language where the profile has them, else as written."""
        from django.utils.translation import get_language

        return self.limits_i18n.get(get_language() or "", self.limits)


@cache
def profiles() -> dict[str, DeviceProfile]:
    found = {}
    for path in sorted(PROFILES_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        data["limits"] = tuple(data.get("limits", ()))
        data["limits_i18n"] = {k: tuple(v) for k, v in data.get("limits_i18n", {}).items()}
        found[data["name"]] = DeviceProfile(**data)
    if "cpu" not in found:
        raise RuntimeError(f"no cpu profile in {PROFILES_DIR}")
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != "cpu", kv[0])))


def profile(name: str) -> DeviceProfile:
    try:
        return profiles()[name]
    except KeyError:
        raise ValueError(f"unknown device type {name!r}; known: {', '.join(profiles())}") from None


def device_choices() -> list[tuple[str, str]]:
    return [(p.name, p.label) for p in profiles().values()]


def train_queues() -> list[str]:
    return [p.queue for p in profiles().values()]


PROBE = PROFILES_DIR / "probe.py"


@dataclass(frozen=True)
class NodeDevice:
    """One device of a node: a card, or the node's CPU (one slot per job it may run at once)."""

    device_type: str
    index: int
    name: str = ""
    memory: int | None = None


def parse_devices(text: str) -> list[NodeDevice]:
    """``PLATFORM_DEVICES``: ``npu:2`` or ``cpu:1,gpu:4``, device types of the profiles."""
    found: list[NodeDevice] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, count = item.partition(":")
        name = name.strip()
        try:
            number = int(count or "1")
        except ValueError:
            raise ValueError(f"PLATFORM_DEVICES: {item!r} is not <type>:<count>") from None
        if number < 1:
            raise ValueError(f"PLATFORM_DEVICES: {item!r} needs a count of at least 1")
        profile(name)  # an unknown type is an error that names the known ones
        found += [NodeDevice(name, i, f"{name}:{i}") for i in range(number)]
    if not found:
        raise ValueError("PLATFORM_DEVICES is empty: give <type>:<count>, e.g. npu:2")
    return found


def devices_from_probe(facts: dict, cpu_slots: int = 1) -> list[NodeDevice]:
    """The devices of a node from the probe's facts: the CPU always, then every accelerator that
    Paddle (or else torch) sees, typed by the profile whose ``detect`` matches."""
    by_detect = {p.detect: p.name for p in profiles().values()}
    cpu = facts.get("cpu") or {}
    cores = cpu.get("cores") or 0
    found = [
        NodeDevice("cpu", i, f"CPU ({cores} cores)", cpu.get("memory")) for i in range(cpu_slots)
    ]
    seen: set[tuple[str, int]] = set()
    for framework in ("paddle", "torch"):
        for dev in (facts.get(framework) or {}).get("devices", []):
            kind = by_detect.get(dev["detect"])
            if kind is None or (kind, dev["index"]) in seen:
                continue
            seen.add((kind, dev["index"]))
            found.append(NodeDevice(kind, dev["index"], dev.get("name") or "", dev.get("memory")))
    return found


def probe(python: str, timeout: float = 180) -> dict:
    """Run the probe with ``python`` (the runtime venv's); its facts, or the error it met."""
    try:
        done = subprocess.run(
            [python, str(PROBE)], capture_output=True, text=True, timeout=timeout, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"error": f"the hardware probe failed ({python} {PROBE}): {exc}"}


def node_split(counts: list[int], device_count: int) -> tuple[int, int] | None:
    """How a job of ``device_count`` devices spans nodes that have ``counts`` devices each:
    (nodes, devices per node), the fewest nodes with the same share on each (the launchers
    start as many processes on every node), or None when these nodes cannot hold it."""
    for nodes in range(1, len(counts) + 1):
        if device_count % nodes == 0:
            per_node = device_count // nodes
            if sum(1 for c in counts if c >= per_node) >= nodes:
                return nodes, per_node
    return None


def placement_plan(
    device: DeviceProfile, counts: list[int], device_count: int
) -> tuple[int, int] | None:
    """(nodes, devices per node) for a job on live nodes with ``counts`` devices each: one node
    when one has enough, several where the device type allows it; None when none can."""
    if not device.multi_node:
        return (1, device_count) if counts and max(counts) >= device_count else None
    return node_split(counts, device_count)
