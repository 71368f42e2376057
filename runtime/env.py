"""Typed reads of the environment, for every process of the platform: the console's settings
(``console/settings.py``, which turns ``EnvError`` into Django's ``ImproperlyConfigured``), the
serving host and the job runner. No Django here.

A variable that is not set, or set to nothing but blanks, takes its default (``empty=`` says
otherwise where an empty value means something of its own). A value that cannot be read as its
type, or lies outside its bounds, raises ``EnvError`` naming the variable and the value."""

import os
from pathlib import Path
from typing import TypeVar

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})
N = TypeVar("N", int, float)


class EnvError(ValueError):
    """An environment variable holds a value its reader cannot take."""


def _raw(name: str) -> str | None:
    """The variable's value stripped of blanks; None when it is unset or blank."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _check_range(name: str, raw: str, value: N, low: N | None, high: N | None) -> N:
    if low is not None and value < low:
        raise EnvError(f"{name}={raw!r}: must be at least {low}")
    if high is not None and value > high:
        raise EnvError(f"{name}={raw!r}: must be at most {high}")
    return value


def env_str(
    name: str,
    default: str = "",
    *,
    required: bool = False,
) -> str:
    """The variable as it is set (a secret keeps its blanks); ``required``: an unset one is an
    error."""
    if _raw(name) is None:
        if required:
            raise EnvError(f"{name} is not set")
        return default
    return os.environ[name]


def env_int(
    name: str,
    default: int,
    *,
    min: int | None = None,
    max: int | None = None,
    empty: int | None = None,
) -> int:
    """The variable as an integer within [min, max]; ``empty``: the value of a variable set to
    nothing (else the default)."""
    raw = _raw(name)
    if raw is None:
        unset = os.environ.get(name) is None
        return default if empty is None or unset else empty
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r}: not an integer") from None
    return _check_range(name, raw, value, min, max)


def env_float(
    name: str,
    default: float,
    *,
    min: float | None = None,
    max: float | None = None,
) -> float:
    """The variable as a finite number within [min, max]."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r}: not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise EnvError(f"{name}={raw!r}: not a finite number")
    return _check_range(name, raw, value, min, max)


def env_bool(name: str, default: bool) -> bool:
    """The variable as a switch: 1, true, yes, on or 0, false, no, off (any case)."""
    raw = _raw(name)
    if raw is None:
        return default
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise EnvError(f"{name}={raw!r}: not a boolean (1/0, true/false, yes/no, on/off)")


def env_list(name: str, default: str = "") -> list[str]:
    """The variable's comma-separated items, blanks dropped; ``default`` (the same form) when
    unset. Set to nothing, it is the empty list."""
    value = os.environ.get(name)
    items = (default if value is None else value).split(",")
    return [item.strip() for item in items if item.strip()]


def env_path(name: str, default: str | Path) -> Path:
    """The variable as a path (not resolved, not checked to exist)."""
    raw = _raw(name)
    return Path(default if raw is None else raw)
