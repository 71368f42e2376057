"""What the enterprise's identity systems share: the directory (console/directory.py) and the
single sign-on (console/oidc.py) both map a person's groups to teams and roles, and both keep
the memberships they map, which the console cannot change (``Membership.mapped_from``)."""

import json
from functools import cache

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ImproperlyConfigured

from console.models import Membership, Team
from console.roles import Role
from console.services import _access_revoked, audit_record

# Stronger roles first: where two groups map a person into one team, the first wins.
ROLE_ORDER = list(Role.values)


@cache
def parse_team_map(text: str, variable: str) -> dict[str, tuple[str, str]]:
    """``{"<group>": "<team slug>:<role>"}`` (JSON) → {group (lower case): (slug, role)}; a
    malformed one is ``ImproperlyConfigured`` naming ``variable``."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{variable} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f'{variable} must be an object: {{"<group>": "team:role"}}')
    mapped = {}
    for group, target in raw.items():
        slug, _sep, role = str(target).partition(":")
        if not slug.strip() or role not in Role.values:
            raise ImproperlyConfigured(
                f"{variable}[{group!r}] = {target!r}: expected “<team slug>:<role>”, "
                f"a role one of {', '.join(Role.values)}"
            )
        mapped[group.strip().lower()] = (slug.strip(), role)
    return mapped


def memberships_apply(
    user: AbstractBaseUser, groups, mapping: dict[str, tuple[str, str]], *, by: str
) -> None:
    """Make ``user``'s mapped memberships those that ``groups`` (the person's groups, nested
    ones included) map to by ``mapping``: a membership from a group they left goes (their
    access to that team ends), one from a group they joined comes (a missing team is made),
    a role follows its group. Memberships made in the console for unmapped teams stay. Each
    change is audited with ``by`` as the actor."""
    wanted: dict[str, tuple[str, str]] = {}  # slug → (role, group)
    for group in sorted(g.lower() for g in groups):
        if group in mapping:
            slug, role = mapping[group]
            if slug not in wanted or ROLE_ORDER.index(role) < ROLE_ORDER.index(wanted[slug][0]):
                wanted[slug] = (role, group)

    def audit(action: str, team: Team, target, **data) -> None:
        data = {"username": user.get_username(), **data}
        audit_record(
            action=action, actor=None, actor_username=by, team=team, target=target, data=data
        )

    for m in Membership.objects.filter(user=user).select_related("team"):
        if m.team.slug in wanted:
            role, group = wanted.pop(m.team.slug)
            if (m.role, m.mapped_from) != (role, group):
                old = m.role
                m.role, m.mapped_from = role, group
                m.save(update_fields=["role", "mapped_from"])
                audit("membership.role_change", m.team, m, group=group, to=role, **{"from": old})
        elif m.mapped_from:
            audit("membership.remove", m.team, m, role=m.role, group=m.mapped_from)
            team = m.team
            m.delete()
            _access_revoked(user, team)
    for slug, (role, group) in wanted.items():
        team = Team.objects.filter(slug=slug).first()
        if team is None:
            team = Team.objects.create(name=slug, slug=slug)
            audit("team.create", team, team, group=group)
        m = Membership.objects.create(team=team, user=user, role=role, mapped_from=group)
        audit("membership.add", team, m, role=role, group=group)
