"""The private-address guard stays on; the platform's own webhook receiver is the exception.

Label Studio checks a webhook's URL when it is saved (``webhooks.serializers``) and again when it
calls it (``webhooks.utils.ssrf_safe_post``, against DNS rebinding). Both are wrapped here: a URL
whose host is literally one of ``PLATFORM_WEBHOOK_HOSTS`` (no name to resolve, so nothing to
rebind), whose port is one of ``PLATFORM_WEBHOOK_PORTS`` (the platform's, not any service on
loopback) and whose path is the platform's receiver ``/hooks/label-studio/<id>/`` passes; every
other URL goes through Label Studio's own check. The names wrapped are those of 1.23.2: if a
release moves them, Label Studio refuses to start rather than run without the guard.
"""

import re
from urllib.parse import urlsplit

from django.apps import AppConfig
from django.conf import settings

RECEIVER_PATH = re.compile(r"/hooks/label-studio/\d+/")
PINNED = "1.23."


def is_platform_webhook(url: str) -> bool:
    try:
        parts = urlsplit(url)
        port = str(parts.port or (443 if parts.scheme == "https" else 80))
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and ("*" in settings.PLATFORM_WEBHOOK_PORTS or port in settings.PLATFORM_WEBHOOK_PORTS)
        and parts.hostname in settings.PLATFORM_WEBHOOK_HOSTS
        and not parts.username
        and not parts.password
        and not parts.query
        and RECEIVER_PATH.fullmatch(parts.path) is not None
    )


class PlatformConfig(AppConfig):
    name = "platform_ls"
    label = "platform_ls"

    def ready(self) -> None:
        import label_studio
        import requests
        import webhooks.serializers
        import webhooks.utils
        from django.core.exceptions import ImproperlyConfigured

        if not label_studio.__version__.startswith(PINNED):
            raise ImproperlyConfigured(
                f"platform_ls is made for Label Studio {PINNED}x, not {label_studio.__version__}: "
                "check platform_ls.mixins and platform_ls.apps against it, then change PINNED."
            )

        guarded_post = webhooks.utils.ssrf_safe_post
        guarded_check = webhooks.serializers.validate_url_for_ssrf

        def post(url, *args, **kwargs):
            if is_platform_webhook(url):
                return requests.post(url, *args, allow_redirects=False, **kwargs)  # noqa: S113
            return guarded_post(url, *args, **kwargs)

        def check(url, block_local_urls=True):
            if is_platform_webhook(url):
                return None
            return guarded_check(url, block_local_urls=block_local_urls)

        webhooks.utils.ssrf_safe_post = post
        webhooks.serializers.validate_url_for_ssrf = check

        from platform_ls import guards

        guards.install()
