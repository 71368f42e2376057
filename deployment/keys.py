"""The API keys of endpoints: issued (the plain key shown once, its hash kept) and revoked;
the reconciler gives the serving hosts the hashes of the active ones."""

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from console.services import audit_record, key_expiry
from deployment.models import MIN_RATE_PER_S, Endpoint, EndpointKey
from deployment.reconcile import converge_soon


@transaction.atomic
def endpoint_key_create(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    name: str,
    rate_per_s: float | None = None,
    expires_in_days: int | None = None,
    adapters: list[str] | None = None,
) -> tuple[EndpointKey, str]:
    """A key for ``endpoint``; the plain key is returned once and only its hash is kept.

    Unlike personal tokens, an endpoint key never expires unless asked to: it lives in an
    application's configuration, where a silent expiry is an outage; revocation is the tool.
    ``adapters``: the endpoint's adapters the key may call, and only those (none: all, and the
    endpoint's own model)."""
    name = name.strip()
    if not name:
        raise ValidationError(_("A key needs a name."))
    if rate_per_s is not None and not rate_per_s >= MIN_RATE_PER_S:
        raise ValidationError(
            _("A rate limit is at least %(n)s requests per second.") % {"n": MIN_RATE_PER_S}
        )
    adapters = sorted(set(adapters or []))
    unknown = set(adapters) - set(endpoint.adapters.values_list("name", flat=True))
    if unknown:
        raise ValidationError(
            _("The endpoint has no adapter named %(n)s.") % {"n": ", ".join(sorted(unknown))}
        )
    expires_at = key_expiry(expires_in_days)
    key, plain = EndpointKey.issue(
        endpoint=endpoint,
        name=name,
        rate_per_s=rate_per_s,
        created_by=actor,
        expires_at=expires_at,
        adapters=adapters,
    )
    audit_record(
        action="endpoint.key_create",
        actor=actor,
        team=endpoint.team,
        target=endpoint,
        data={
            "key": key.name,
            "prefix": key.prefix,
            "rate_per_s": rate_per_s,
            "expires_at": expires_at.isoformat() if expires_at else None,
            "adapters": adapters,
        },
    )
    converge_soon()
    return key, plain


@transaction.atomic
def endpoint_key_revoke(*, actor: AbstractBaseUser, key: EndpointKey) -> EndpointKey:
    if key.revoke():
        audit_record(
            action="endpoint.key_revoke",
            actor=actor,
            team=key.endpoint.team,
            target=key.endpoint,
            data={"key": key.name, "prefix": key.prefix},
        )
        converge_soon()
    return key
