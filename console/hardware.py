"""Device types, read from their profiles in ``platform/hardware/*.toml``: the one definition of
a device type's Paddle device string, visibility variable and Celery queue. Adding a device
type is adding a profile."""

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
    queue: str
    amp: bool
    bf16: bool
    # Tested on the platform's own machines (CPU), or declared from the vendor's documentation.
    tested: bool
    limits: tuple[str, ...] = field(default=())


@cache
def profiles() -> dict[str, DeviceProfile]:
    found = {}
    for path in sorted(PROFILES_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        data["limits"] = tuple(data.get("limits", ()))
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
