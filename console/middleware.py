from collections.abc import Callable
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

# The client address of the request being served, read by the audit log. Services run from
# Celery tasks or management commands see None.
client_ip: ContextVar[str | None] = ContextVar("client_ip", default=None)


def request_ip(request: HttpRequest) -> str | None:
    # REMOTE_ADDR only: X-Forwarded-For is client-controlled unless a trusted proxy rewrites it.
    return request.META.get("REMOTE_ADDR") or None


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = client_ip.set(request_ip(request))
        try:
            return self.get_response(request)
        finally:
            client_ip.reset(token)
