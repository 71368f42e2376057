"""The platform's administration of Label Studio's organisations and accounts.

Label Studio's community edition has no API to create an organisation or to move a user
between organisations, so the platform drives Label Studio's own Django. Run with Label
Studio's Python, its data directory and this directory's parent on PYTHONPATH::

    LABEL_STUDIO_BASE_DATA_DIR=… PYTHONPATH=platform/label_studio_ext \\
        .venv-labelstudio/bin/python -m platform_ls.manage < ops.json

Standard input: ``{"domain": "<accounts' e-mail domain>", "ops": [{"op": …}, …]}`` (on stdin,
never in argv: it holds passwords and tokens). Standard output: one JSON object, ``{"results":
[…]}``, one result per op. Every op is idempotent.

- ``team`` {id, title, token}: the organisation of platform team ``id``, owned by the service
  account ``team-<id>@<domain>`` (no password, no session, no token but the platform's
  ``token``). An account of that address that was not made with its organisation here
  (someone made it in advance) is revoked and renamed, never adopted.
- ``member`` {email, password, name, teams: [team], active}: the account exists, is active, is a
  member of exactly these teams' organisations (``team`` as above) and works in ``active``'s.
- ``revoke`` {email}: the account is deactivated, leaves every organisation, its tokens are
  deleted and its sessions end.
- ``end_sessions`` {email, password}: every session of the account ends (Django checks a
  session against a hash of the password's hash: set again with a new salt, it changes), and
  every API token (legacy tokens deleted, JWTs blacklisted).
- ``converge`` {teams: [team], accounts: [{email, teams: [id], active}]}: the whole desired
  state; accounts of the domain that are not listed (teams' service accounts apart), or listed
  with no team, are revoked, and every team organisation loses the members that are not listed
  for it. Every organisation's invite token is reset, and an active organisation that is no
  active membership of its user is replaced.
"""

import json
import os
import pathlib
import re
import sys


def _setup() -> None:
    import label_studio

    sys.path.insert(0, str(pathlib.Path(label_studio.__file__).parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_ls.settings")
    import django

    django.setup()


SERVICE = re.compile(r"team-\d+@")


def _service_email(team_id: int, domain: str) -> str:
    return f"team-{team_id}@{domain}"


def _team(spec: dict, domain: str):
    from django.db import transaction
    from organizations.models import Organization
    from rest_framework.authtoken.models import Token
    from users.models import User

    email = _service_email(spec["id"], domain)
    with transaction.atomic():
        user = User.objects.filter(email=email).first()
        if user is not None and not Organization.objects.filter(created_by=user).exists():
            # Not made here (the service account and its organisation are made together): an
            # account someone made in advance under a future team's name. It is not adopted.
            _revoke(user, force=True)
            user.email = f"squatted-{user.pk}-{email}"[:254]
            user.username = user.email.split("@")[0][:256]
            user.save(update_fields=["email", "username"])
            user = None
        if user is None:
            user = User.objects.create_user(
                email=email, password=None, username=email.split("@")[0]
            )
            user.set_unusable_password()
            user.save()
        org = Organization.objects.filter(created_by=user).first()
        if org is None:
            org = Organization.create_organization(
                created_by=user, title=spec.get("title") or email, legacy_api_tokens_enabled=True
            )
        elif spec.get("title") and org.title != spec["title"]:
            org.title = spec["title"]
            org.save(update_fields=["title"])
        if not org.jwt.legacy_api_tokens_enabled:
            org.jwt.legacy_api_tokens_enabled = True
            org.jwt.save()
        org.add_user(user)
        usable = user.has_usable_password()
        if user.active_organization_id != org.pk or not user.is_active or usable:
            user.active_organization = org
            user.is_active = True
            # Nobody logs in as a service account: no password, so no session either.
            user.set_unusable_password()
            user.save(update_fields=["active_organization", "is_active", "password"])
        # Its only credential is the platform's token: any other token, and any JWT, goes.
        _blacklist_jwts(user)
        if spec.get("token"):
            Token.objects.filter(user=user).exclude(key=spec["token"]).delete()
            Token.objects.get_or_create(user=user, key=spec["token"])
        else:
            Token.objects.filter(user=user).delete()
    return user, org


def _set_memberships(user, orgs: dict, active) -> None:
    from organizations.models import OrganizationMember

    for member in OrganizationMember.objects.filter(user=user).exclude(
        organization__in=orgs.values()
    ):
        member.delete()
    for org in orgs.values():
        member = OrganizationMember.objects.filter(user=user, organization=org).first()
        if member is None:
            OrganizationMember.objects.create(user=user, organization=org)
        elif member.deleted_at is not None:
            member.deleted_at = None
            member.save(update_fields=["deleted_at"])
    target = orgs.get(active) or next(iter(orgs.values()), None)
    # Label Studio's login makes the user's first membership (lowest id) the active
    # organisation: the target's membership is made the first.
    first = OrganizationMember.objects.filter(user=user).order_by("pk").first()
    if target is not None and first is not None and first.organization_id != target.pk:
        others = OrganizationMember.objects.filter(user=user).exclude(organization=target)
        again = list(others.values_list("organization_id", flat=True))
        others.delete()
        for org_id in again:
            OrganizationMember.objects.create(user=user, organization_id=org_id)
    if user.active_organization_id != (target.pk if target else None):
        user.active_organization = target
        user.save(update_fields=["active_organization"])


def _member(spec: dict, domain: str, teams: dict) -> dict:
    from django.db import transaction
    from users.models import User

    with transaction.atomic():
        orgs = dict(teams)
        user = User.objects.filter(email=spec["email"]).first()
        if user is None:
            user = User.objects.create_user(
                email=spec["email"], password=spec["password"], username=spec["email"].split("@")[0]
            )
        elif spec.get("password") and not user.check_password(spec["password"]):
            # Not the password the platform gives it: an account made by someone else under
            # the platform's address, or one revoked before. Whatever credentials it had go.
            user.set_password(spec["password"])
            _tokens_delete(user)
        if spec.get("name") is not None:
            user.first_name = spec["name"][:256]
        user.is_active = True
        user.save()
        _set_memberships(user, orgs, spec.get("active"))
    active = next((t for t, o in orgs.items() if o.pk == user.active_organization_id), None)
    return {"user": user.pk, "active": active}


def _blacklist_jwts(user) -> None:
    from rest_framework_simplejwt.token_blacklist.models import BlacklistedToken, OutstandingToken

    for outstanding in OutstandingToken.objects.filter(user=user, blacklistedtoken__isnull=True):
        BlacklistedToken.objects.get_or_create(token=outstanding)


def _tokens_delete(user) -> bool:
    """Every API token of the account (legacy tokens deleted, JWTs blacklisted). True if one
    was deleted."""
    from rest_framework.authtoken.models import Token

    _blacklist_jwts(user)
    return Token.objects.filter(user=user).delete()[0] > 0


def _revoke(user, force: bool = False) -> bool:
    """Deactivate, leave every organisation, delete tokens, end sessions. True if it changed."""
    from organizations.models import OrganizationMember

    changed = force or user.is_active or OrganizationMember.objects.filter(user=user).exists()
    changed |= _tokens_delete(user)
    OrganizationMember.objects.filter(user=user).delete()
    if changed:
        user.is_active = False
        user.active_organization = None
        # A new password hash: every session (signed cookies, checked against it) ends.
        user.set_unusable_password()
        user.save()
    return changed


def _end_sessions(spec: dict) -> bool:
    from users.models import User

    user = User.objects.filter(email=spec["email"]).first()
    if user is None:
        return False
    # Its API tokens too: a token made from a session (LS's account page) outlives it.
    _tokens_delete(user)
    if spec.get("password"):
        user.set_password(spec["password"])  # the same password, a new salt: a new hash
    else:
        user.set_unusable_password()
    user.save(update_fields=["password"])
    return True


def _converge(spec: dict, domain: str, teams: dict) -> dict:
    from django.db import transaction
    from django.db.models import Exists, OuterRef
    from organizations.models import Organization, OrganizationMember
    from users.models import User

    service = {_service_email(t, domain) for t in teams}
    listed = {a["email"]: a for a in spec["accounts"]}
    result = {"accounts": {}, "revoked": [], "removed": []}
    with transaction.atomic():
        for email, account in listed.items():
            user = User.objects.filter(email=email).first()
            if user is None:
                continue
            wanted = [t for t in account["teams"] if t in teams]
            if not wanted:
                if _revoke(user):
                    result["revoked"].append(email)
                result["accounts"][email] = {"user": user.pk, "active": None}
                continue
            if not user.is_active:
                user.is_active = True
                user.save(update_fields=["is_active"])
            _set_memberships(user, {t: teams[t] for t in wanted}, account.get("active"))
            active = next((t for t in wanted if teams[t].pk == user.active_organization_id), None)
            result["accounts"][email] = {"user": user.pk, "active": active}
        # Accounts of the platform's domain that it no longer lists (their user was deleted).
        # Teams' service accounts stay: only the platform holds their tokens, and a deleted
        # team's organisation keeps nobody else (its members left it above).
        for user in User.objects.filter(email__iendswith="@" + domain):
            if SERVICE.match(user.email) or user.email in listed or user.email in service:
                continue
            if _revoke(user):
                result["revoked"].append(user.email)
        # Anyone else in a team's organisation: an account signed up through an invite link
        # that a member made, or added by hand in Label Studio.
        allowed = {t: {e for e, a in listed.items() if t in a["teams"]} for t in teams}
        for team_id, org in teams.items():
            strangers = OrganizationMember.objects.filter(organization=org).exclude(
                user__email__in=allowed[team_id] | {_service_email(team_id, domain)}
            )
            for stranger in strangers.select_related("user"):
                result["removed"].append({"team": team_id, "email": stranger.user.email})
                org.remove_user(stranger.user)
        # An invite link that leaked is worth nothing after this: the teams' organisations'
        # and every other one's (the first, Label Studio's own, lets whoever holds its link
        # sign up an account that no team lists).
        for org in Organization.objects.all():
            org.reset_token()
        # An active organisation that is no active membership (written before platform_ls's
        # guard): saved again, the guard (platform_ls.guards) moves it to a membership's.
        member = OrganizationMember.objects.filter(
            user=OuterRef("pk"), organization=OuterRef("active_organization"), deleted_at=None
        )
        for user in User.objects.exclude(active_organization=None).exclude(Exists(member)):
            user.save(update_fields=["active_organization"])
    return result


def run(request: dict) -> list:
    from users.models import User

    domain = request["domain"]
    results = []
    for op in request["ops"]:
        kind = op["op"]
        teams = {}
        for spec in op.get("teams", []):
            if isinstance(spec, dict):
                teams[spec["id"]] = _team(spec, domain)[1]
        if kind == "team":
            user, org = _team(op, domain)
            results.append({"organization": org.pk, "user": user.pk})
        elif kind == "member":
            results.append(_member(op, domain, teams))
        elif kind == "revoke":
            user = User.objects.filter(email=op["email"]).first()
            results.append({"revoked": bool(user and _revoke(user))})
        elif kind == "end_sessions":
            results.append({"ended": _end_sessions(op)})
        elif kind == "converge":
            results.append(_converge(op, domain, teams))
        else:
            raise SystemExit(f"unknown op {kind!r}")
    return results


def main() -> None:
    request = json.load(sys.stdin)
    _setup()
    json.dump({"results": run(request)}, sys.stdout)


if __name__ == "__main__":
    main()
