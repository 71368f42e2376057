from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from console.lockout import token_failed
from console.models import TOKEN_PREFIX, ApiToken, hash_token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer mp_…`` with a personal API token (``Token mp_…`` works too)."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() not in self.keywords:
            return None
        if len(header) != 2 or not header[1].startswith(TOKEN_PREFIX):
            token_failed(request._request)  # guessing counts, malformed or not
            raise exceptions.AuthenticationFailed(_("Malformed Authorization header."))
        token = (
            ApiToken.objects.select_related("user").filter(key_hash=hash_token(header[1])).first()
        )
        if token is None:
            # A guess: counted against the address, which is locked out after too many (429).
            # Known tokens (expired, revoked) are no guesses and count nothing.
            token_failed(request._request)
            raise exceptions.AuthenticationFailed(_("Invalid or revoked API token."))
        if token.revoked_at is not None or not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("Invalid or revoked API token."))
        if token.is_expired:
            raise exceptions.AuthenticationFailed(
                _("This token expired on %(date)s: create a new one on the Tokens page.")
                % {"date": timezone.localtime(token.expires_at).isoformat(timespec="minutes")}
            )
        now = timezone.now()
        # Bounded write rate: touch last_used_at at most once a minute per token.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return "Bearer"
