"""A team's storage quota: what it keeps in the platform's storage, counted by the apps that keep
it (console imports none of them: each registers its counter in ``storage_counters``), checked
before anything new is stored."""

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

from console.models import Team

# Each takes a team and returns the bytes it keeps in storage of one kind (uploads, base
# models, model versions…); registered by the apps in their AppConfig.ready().
storage_counters: dict[str, Callable[[Team], int]] = {}
# Their names as pages show them (registered with them; the kind itself where none is).
storage_labels: dict[str, str] = {}

GB = 1024**3


def team_storage_quota(team: Team) -> int | None:
    """The team's quota in bytes (its own, else TEAM_STORAGE_QUOTA_GB), None for no limit."""
    gb = team.storage_quota_gb
    if gb is None:
        gb = settings.TEAM_STORAGE_QUOTA_GB
    return int(gb * GB) if gb and gb > 0 else None


def team_storage_usage(team: Team) -> dict[str, int]:
    """The bytes the team keeps, by kind."""
    return {kind: count(team) for kind, count in storage_counters.items()}


def storage_label(kind: str) -> str:
    return str(storage_labels.get(kind, kind))


def team_storage_used(team: Team) -> int:
    return sum(team_storage_usage(team).values())


def _size(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 1024**2:.1f} MB"


def team_storage_check(team: Team, adding: int, *, used: int | None = None) -> None:
    """Refuse (ValidationError) ``adding`` bytes more when they would take the team past its
    quota, with what it uses and its limit. ``used``: the usage already counted."""
    quota = team_storage_quota(team)
    if quota is None:
        return
    used = team_storage_used(team) if used is None else used
    if used + adding > quota:
        raise ValidationError(
            _(
                "The team's storage quota would be exceeded: it uses %(used)s of its %(quota)s, "
                "and this needs %(adding)s more. Delete datasets or models, or ask site staff "
                "for a larger quota."
            )
            % {"used": _size(used), "quota": _size(quota), "adding": _size(adding)},
            code="storage_quota",
        )
