"""The connection to Label Studio: the SDK client, and its health for the dashboard.

The client is ``label_studio_sdk.client.LabelStudio`` with the platform's personal access
token; it refreshes the short-lived access token itself.
"""

from functools import lru_cache

import httpx
from django.conf import settings
from django.utils.translation import gettext as _
from label_studio_sdk.client import LabelStudio

from console.health import Check


class NotConfigured(RuntimeError):
    pass


def token() -> str:
    if settings.LABEL_STUDIO_TOKEN:
        return settings.LABEL_STUDIO_TOKEN
    try:
        return settings.LABEL_STUDIO_TOKEN_FILE.read_text().strip()
    except FileNotFoundError:
        raise NotConfigured(
            _(
                "No token for Label Studio: set LABEL_STUDIO_TOKEN, or wait for the Label Studio "
                "that `make run` starts to write %(file)s."
            )
            % {"file": settings.LABEL_STUDIO_TOKEN_FILE}
        ) from None


@lru_cache(maxsize=4)
def _client(url: str, api_key: str) -> LabelStudio:
    return LabelStudio(base_url=url, api_key=api_key, timeout=30)


def client() -> LabelStudio:
    if not settings.LABEL_STUDIO_URL:
        raise NotConfigured(_("LABEL_STUDIO_URL is not set."))
    return _client(settings.LABEL_STUDIO_URL, token())


def check_health() -> Check:
    """Label Studio answers, and accepts the platform's token."""
    name = "labelstudio"
    if not settings.LABEL_STUDIO_URL:
        return Check(name, False, _("LABEL_STUDIO_URL is not set."))
    try:
        response = httpx.get(f"{settings.LABEL_STUDIO_URL}/health", timeout=2)
        if response.status_code != 200:
            return Check(name, False, f"{settings.LABEL_STUDIO_URL}: HTTP {response.status_code}")
        version = client().versions.get()
    except NotConfigured as exc:
        return Check(name, False, str(exc))
    except Exception as exc:
        return Check(name, False, f"{settings.LABEL_STUDIO_URL}: {exc}")
    release = getattr(version, "release", None) or ""
    return Check(name, True, f"Label Studio {release} · {settings.LABEL_STUDIO_URL}".strip())
