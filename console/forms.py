from django import forms
from django.utils.translation import gettext_lazy as _

from console.roles import Role


class TeamForm(forms.Form):
    name = forms.CharField(label=_("Team name"), max_length=100)


class InviteForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.VIEWER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


class TokenForm(forms.Form):
    name = forms.CharField(label=_("Token name"), max_length=100)


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
