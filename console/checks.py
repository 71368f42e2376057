"""Configuration checks at start (Django's system checks, ``manage.py check`` and every
process's start): a malformed identity setting stops the platform with its name, instead of
failing the first person who logs in."""

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured


@register()
def identity_settings(app_configs, **kwargs) -> list[Error]:
    from console import directory, oidc

    errors = []
    checks = []
    if directory.enabled():
        checks += [directory.team_map, directory.ldap_settings]
    if oidc.enabled():
        checks.append(oidc.team_map)
    for check in checks:
        try:
            check()
        except ImproperlyConfigured as exc:
            if str(exc) not in {e.msg for e in errors}:
                errors.append(Error(str(exc), id="console.E001"))
    return errors
