from django import forms
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from console.roles import Role
from console.services import api_token_default_days


def error_text(exc: ValidationError | PermissionDenied) -> str:
    """What a refused request is told (a form's error, a message): a service's reasons."""
    if isinstance(exc, PermissionDenied):
        return str(exc)
    return " ".join(exc.messages)


class TeamForm(forms.Form):
    name = forms.CharField(label=_("Team name"), max_length=100)


class InviteForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.VIEWER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


NEVER = "never"


def expiry_choices(default_days: int | None) -> list[tuple[str, str]]:
    """The "in N days" choices (the configured ones and the default), then "never"."""
    days = sorted(
        {*settings.API_TOKEN_EXPIRY_CHOICES_DAYS, *([default_days] if default_days else [])}
    )
    return [
        *((str(d), ngettext("in %(n)d day", "in %(n)d days", d) % {"n": d}) for d in days),
        (NEVER, _("never")),
    ]


class TokenForm(forms.Form):
    name = forms.CharField(label=_("Token name"), max_length=100)
    expires_in_days = forms.ChoiceField(label=_("Expires"), required=False)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        default = api_token_default_days()
        field = self.fields["expires_in_days"]
        field.choices = expiry_choices(default)
        field.initial = str(default) if default else NEVER

    def clean_expires_in_days(self) -> int | None:
        """Days, None for never; left out: the configured default."""
        value = self.cleaned_data["expires_in_days"]
        if not value:
            return api_token_default_days()
        return None if value == NEVER else int(value)


class UserForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    password = forms.CharField(label=_("Initial password"), widget=forms.PasswordInput)
    is_staff = forms.BooleanField(label=_("Site administrator"), required=False)


class AuditFilterForm(forms.Form):
    action = forms.CharField(
        label=_("Action"), required=False, widget=forms.TextInput(attrs={"list": "audit-actions"})
    )
    actor = forms.CharField(label=_("User"), required=False)
    since = forms.DateField(
        label=_("From"), required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        label=_("To"), required=False, widget=forms.DateInput(attrs={"type": "date"})
    )


class QuotaForm(forms.Form):
    """Site staff set one team's quotas (services.team_quotas_set): empty is the site's
    default (jobs, storage) or no limit (device-hours of a device type)."""

    team = forms.SlugField(widget=forms.HiddenInput)
    max_concurrent_jobs = forms.IntegerField(
        label=_("Jobs at once"), required=False, min_value=1, max_value=1000
    )
    storage_quota_gb = forms.FloatField(
        label=_("Storage (GB)"), required=False, min_value=0, max_value=10**7
    )
    max_endpoints = forms.IntegerField(
        label=_("Endpoints"), required=False, min_value=0, max_value=10_000
    )
    max_replicas = forms.IntegerField(
        label=_("Predictor replicas"), required=False, min_value=0, max_value=10_000
    )

    def __init__(self, *args, device_types: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.device_types = device_types
        for device in device_types:
            self.fields[f"hours_{device}"] = forms.FloatField(
                label=_("%(device)s device-hours a month") % {"device": device},
                required=False,
                min_value=0,
                max_value=100_000,
            )

    def device_hours(self) -> dict[str, float]:
        return {
            d: self.cleaned_data[f"hours_{d}"]
            for d in self.device_types
            if self.cleaned_data.get(f"hours_{d}") is not None
        }


class ChannelForm(forms.Form):
    """A team's notification channel: email addresses, or a group robot's webhook and secret."""

    name = forms.CharField(label=_("Name"), max_length=100)
    kind = forms.ChoiceField(label=_("Kind"), choices=[])
    target = forms.CharField(
        label=_("Email addresses, or the robot's webhook address"),
        max_length=2000,
        widget=forms.TextInput(attrs={"size": 60}),
    )
    secret = forms.CharField(
        label=_("Signing secret (DingTalk 加签, Feishu 签名校验)"),
        max_length=200,
        required=False,
        widget=forms.PasswordInput,
    )
    events = forms.MultipleChoiceField(
        label=_("Events"), choices=[], widget=forms.CheckboxSelectMultiple
    )

    def __init__(self, *args, **kwargs) -> None:
        from console.models import NotificationChannel
        from console.notifications import EVENTS

        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = NotificationChannel.Kind.choices
        self.fields["events"].choices = list(EVENTS.items())
