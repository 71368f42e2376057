import ipaddress
from collections.abc import Callable
from contextvars import ContextVar
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse

# The client address of the request being served, read by the audit log. Services run from
# Celery tasks or management commands see None.
client_ip: ContextVar[str | None] = ContextVar("client_ip", default=None)


@lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple[ipaddress._BaseNetwork, ...]:
    return tuple(ipaddress.ip_network(p, strict=False) for p in proxies)


def _trusted(address: str, proxies: tuple[str, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in _networks(proxies))


def request_ip(request: HttpRequest) -> str | None:
    """The client's address: REMOTE_ADDR, unless that is a trusted proxy (TRUSTED_PROXIES);
    then the nearest address in X-Forwarded-For that is not one. A client can put anything in
    X-Forwarded-For, so only what the trusted proxies appended (the right end) is believed."""
    remote = request.META.get("REMOTE_ADDR") or None
    proxies = tuple(settings.TRUSTED_PROXIES)
    if remote is None or not proxies or not _trusted(remote, proxies):
        return remote
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    for address in reversed([a for a in forwarded if a]):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            return remote  # garbage where a proxy should have written an address
        if not _trusted(address, proxies):
            return address
    return remote


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = client_ip.set(request_ip(request))
        try:
            return self.get_response(request)
        finally:
            client_ip.reset(token)
