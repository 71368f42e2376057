"""Console pages of the platform core: dashboard, teams, members, API tokens, audit, users,
nodes."""

import datetime
import sys
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, update_session_auth_hash
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordChangeForm, SetPasswordForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render, resolve_url
from django.utils import timezone
from django.utils.html import escape
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from console import (
    hardware,
    health,
    lockout,
    oidc,
    overview,
    quotas,
    selectors,
    services,
    usage,
)
from console.forms import (
    AuditFilterForm,
    ChannelForm,
    InviteForm,
    QuotaForm,
    RoleForm,
    TeamForm,
    TokenForm,
    UserForm,
    error_text,
)
from console.middleware import request_ip
from console.models import Team
from console.pagination import paginate, render_page
from console.permissions import LAST_TEAM_SESSION_KEY, team_view
from console.roles import Perm, Role, role_allows


class Logout(auth_views.LogoutView):
    """Log out; a single sign-on session is ended at the provider too, which sends the person
    back to the login page (so that the next login asks them again)."""

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        id_token = request.session.get("oidc_id_token")
        response = super().post(request, *args, **kwargs)
        if id_token and oidc.enabled():
            back = request.build_absolute_uri(resolve_url(settings.LOGOUT_REDIRECT_URL))
            url = oidc.end_session_url(id_token, back)
            if url:
                return redirect(url)
        return response


@login_required
def home(request: HttpRequest) -> HttpResponse:
    teams = selectors.teams_for_user(request.user)
    # This session's last team, else the one last visited in any session, else the first.
    last = request.session.get(LAST_TEAM_SESSION_KEY) or selectors.last_visited_team(request.user)
    team = teams.filter(slug=last).first() or teams.first()
    if team is None:
        return redirect("console:team_create")
    return redirect("console:dashboard", team=team.slug)


@login_required
def team_create(request: HttpRequest) -> HttpResponse:
    """A new team; an account that may not create one (PLATFORM_TEAM_CREATION) is told whom
    to ask (and a POST is refused, 403, by the service)."""
    allowed = services.team_create_allowed(request.user)
    if request.method == "POST" and not allowed:
        raise PermissionDenied
    form = TeamForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            team = services.team_create(actor=request.user, name=form.cleaned_data["name"])
        except ValidationError as exc:
            form.add_error("name", error_text(exc))
        else:
            messages.success(request, _("Team “%(name)s” created.") % {"name": team.name})
            return redirect("console:dashboard", team=team.slug)
    return render(request, "console/team_create.html", {"form": form, "allowed": allowed})


@team_view()
def dashboard(request: HttpRequest) -> HttpResponse:
    steps = overview.first_run(request.team)
    return render(
        request,
        "console/dashboard.html",
        {
            "member_count": selectors.team_memberships(request.team).count(),
            "first_run": steps,
            "next_step": overview.next_step(steps),
            "panels": overview.team_panels(request.team),
        },
    )


@login_required
def health_panel(request: HttpRequest) -> HttpResponse:
    """The health strip of the dashboard, refreshed by htmx: each service alive or down, and
    for site staff what each check found."""
    return render(request, "console/_health.html", {"checks": health.platform_health()})


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """The platform's figures for Prometheus (console.metrics), to the token or the networks
    configured (PLATFORM_METRICS_TOKEN, PLATFORM_METRICS_ALLOW); 404 to anyone else. The
    address is the client's as the trusted proxies say (a scrape through nginx from outside
    is not loopback's)."""
    from console.metrics import PlatformCollector, django_exposition
    from serving.prometheus import CONTENT_TYPE, exposition, scrape_allowed

    allowed = scrape_allowed(
        request.headers.get("authorization", ""),
        request_ip(request) or "",
        settings.METRICS_TOKEN,
        settings.METRICS_ALLOW,
    )
    if not allowed:
        raise Http404
    figures = exposition(PlatformCollector()) + django_exposition()
    return HttpResponse(figures, content_type=CONTENT_TYPE)


@login_required
def nodes(request: HttpRequest) -> HttpResponse:
    """The machines that train: their devices, what holds each, and whose heartbeat stopped."""
    page, query = paginate(request, selectors.nodes_with_devices())
    return render(
        request,
        "console/nodes.html",
        {
            "nodes": selectors.nodes_overview(request.user, page),
            "page": page,
            "query": query,
            "profiles": hardware.profiles().values(),
        },
    )


@team_view(write=Perm.TEAM_MANAGE)
def members(request: HttpRequest) -> HttpResponse:
    form = InviteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            membership = services.membership_add(
                actor=request.user, team=request.team, **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_error("username", error_text(exc))
        else:
            messages.success(
                request,
                _("%(username)s joined the team as %(role)s.")
                % {"username": membership.user.username, "role": membership.get_role_display()},
            )
            return redirect("console:members", team=request.team.slug)
    return render_page(
        request,
        "console/members.html",
        selectors.team_memberships(request.team),
        {
            "form": form,
            "roles": Role.choices,
            "can_manage": role_allows(request.membership.role, Perm.TEAM_MANAGE),
        },
        name="memberships",
    )


@team_view(write=Perm.TEAM_MANAGE)
@require_POST
def member_role(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = selectors.team_membership_get(request.team, membership_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose one of the roles."))
    else:
        try:
            services.membership_change_role(
                actor=request.user, membership=membership, role=form.cleaned_data["role"]
            )
            messages.success(request, _("Role changed."))
        except ValidationError as exc:
            messages.error(request, error_text(exc))
    return redirect("console:members", team=request.team.slug)


@team_view(write=Perm.TEAM_MANAGE)
@require_POST
def member_remove(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = selectors.team_membership_get(request.team, membership_id)
    try:
        services.membership_remove(actor=request.user, membership=membership)
        messages.success(request, _("Member removed."))
    except ValidationError as exc:
        messages.error(request, error_text(exc))
    return redirect("console:members", team=request.team.slug)


@team_view(read=Perm.AUDIT_VIEW)
def audit(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    events = selectors.team_audit_events(request.team, viewer=request.user, **filters)
    return render_page(
        request,
        "console/audit.html",
        events,
        {"form": form, "actions": selectors.audit_actions(request.team)},
    )


@never_cache  # the page that shows a new key must not stay in the browser's cache
@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        try:
            _token, key = services.api_token_create(
                actor=request.user,
                name=form.cleaned_data["name"],
                expires_in_days=form.cleaned_data["expires_in_days"],
            )
        except ValidationError as exc:
            form.add_error("name", error_text(exc))
        else:
            # Shown this once, in this very answer (never cached): only its hash is kept, and
            # the plain key is stored nowhere on the way (no session, no message).
            new_key = key
            form = TokenForm()
    return render_page(
        request,
        "console/tokens.html",
        selectors.user_api_tokens(request.user),
        {"form": form, "new_key": new_key},
        name="tokens",
    )


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = selectors.user_api_token_get(request.user, token_id)
    services.api_token_revoke(actor=request.user, token=token)
    messages.success(request, _("Token “%(name)s” revoked.") % {"name": token.name})
    return redirect("console:tokens")


@login_required
def password_change(request: HttpRequest) -> HttpResponse:
    form = PasswordChangeForm(request.user, request.POST or None)
    if request.method == "POST" and form.is_valid():
        # Other sessions and the API tokens end; this session stays.
        services.user_set_password(
            actor=request.user,
            user=request.user,
            password=form.cleaned_data["new_password1"],
            keep_session=request.session.session_key,
        )
        update_session_auth_hash(request, request.user)
        messages.success(request, _("Your password was changed."))
        return redirect("console:home")
    return render(request, "console/password.html", {"form": form})


def staff_required(view):
    """Site administrators only; to anybody else the page does not exist."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_staff:
            raise Http404
        return view(request, *args, **kwargs)

    return wrapped


@staff_required
def users(request: HttpRequest) -> HttpResponse:
    form = UserForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = services.user_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, _("Account “%(username)s” created.") % {"username": user})
            return redirect("console:users")
    return render_page(
        request,
        "console/users.html",
        get_user_model().objects.select_related("external_account").order_by("username"),
        {"form": form, "lockouts": lockout.active_lockouts()},
        name="users",
    )


@staff_required
def lockout_clear(request: HttpRequest) -> HttpResponse:
    """Lift a login lockout (an account's or an address's); the lockouts are listed on the
    Accounts page, where a GET goes."""
    if request.method != "POST":
        return redirect("console:users")
    kind, value = request.POST.get("kind", ""), request.POST.get("value", "")
    try:
        services.lockout_clear(
            actor=request.user,
            username=value if kind == "account" else "",
            address=value if kind == "address" else "",
        )
        messages.success(request, _("“%(value)s” unlocked.") % {"value": value})
    except ValidationError as exc:
        messages.error(request, error_text(exc))
    return redirect("console:users")


@staff_required
def user_tokens(request: HttpRequest, user_id: int) -> HttpResponse:
    """Another account's personal API tokens, for site staff to see and revoke."""
    account = selectors.account_get(user_id)
    return render_page(
        request,
        "console/user_tokens.html",
        selectors.user_api_tokens(account),
        {"account": account},
        name="tokens",
    )


@staff_required
@require_POST
def user_token_revoke(request: HttpRequest, user_id: int, token_id: int) -> HttpResponse:
    account = selectors.account_get(user_id)
    token = selectors.user_api_token_get(account, token_id)
    services.api_token_revoke(actor=request.user, token=token)
    messages.success(request, _("Token “%(name)s” revoked.") % {"name": token.name})
    return redirect("console:user_tokens", user_id=account.pk)


@staff_required
@require_POST
def user_password(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(get_user_model(), pk=user_id)
    form = SetPasswordForm(user, request.POST)
    if form.is_valid():
        mine = user.pk == request.user.pk
        services.user_set_password(
            actor=request.user,
            user=user,
            password=form.cleaned_data["new_password1"],
            keep_session=request.session.session_key if mine else None,
        )
        if mine:
            update_session_auth_hash(request, user)
        messages.success(request, _("Password of “%(username)s” reset.") % {"username": user})
    else:
        messages.error(request, " ".join(e for errs in form.errors.values() for e in errs))
    return redirect("console:users")


@staff_required
@require_POST
def user_active(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(get_user_model(), pk=user_id)
    try:
        services.user_set_active(actor=request.user, user=user, active=not user.is_active)
    except ValidationError as exc:
        messages.error(request, error_text(exc))
    return redirect("console:users")


def server_error(request: HttpRequest) -> HttpResponse:
    """The 500 handler (``handler500``): the database unreachable (restarted, failed over) is
    a 503 that asks to try again, in JSON for the API; anything else is Django's 500 page.
    Renders no template: a template's context processors would query the database again."""
    from django.db import InterfaceError, OperationalError
    from django.views.defaults import server_error as default_server_error

    if not isinstance(sys.exc_info()[1], OperationalError | InterfaceError):
        return default_server_error(request)
    message = _("The database is unavailable for a moment; nothing was changed. Try again.")
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": message}, status=503)
    else:
        body = f"<!doctype html><title>503</title><h1>503</h1><p>{escape(message)}</p>"
        response = HttpResponse(body, status=503)
    response["Retry-After"] = "5"
    return response


def _month(text: str | None):
    """``YYYY-MM`` (the usage pages' month), else this month."""
    try:
        year, month = (int(x) for x in (text or "").split("-"))
        if 2000 <= year <= 2999:
            return usage.month_start(datetime.date(year, month, 1))
    except ValueError:
        pass
    return usage.month_start()


def _usage_file(start, kind: str, team=None) -> HttpResponse:
    """The month's usage lines as CSV (UTF-8 with a BOM: Excel reads the Chinese) or XLSX."""
    name = f"usage-{team.slug if team else 'all'}-{start:%Y-%m}.{kind}"
    if kind == "xlsx":
        response = HttpResponse(
            usage.usage_xlsx(start, team),
            content_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        )
    else:
        response = HttpResponse(
            "\ufeff" + usage.usage_csv(start, team), content_type="text/csv; charset=utf-8"
        )
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _months(start) -> dict:
    previous = usage.month_start(start - datetime.timedelta(days=1))
    return {
        "month": start,
        "previous": f"{previous:%Y-%m}",
        "next": f"{usage.next_month(start):%Y-%m}",
        "is_current": start == usage.month_start(),
    }


@team_view(write=Perm.TEAM_MANAGE)
def notifications(request: HttpRequest) -> HttpResponse:
    """What the team was told (every member; seen from now on, the bell counts none), and, for
    its owners, the channels that tell it elsewhere and how their deliveries went."""
    from console import notifications as notices
    from console.models import Membership, NotificationDelivery

    can_manage = role_allows(request.membership.role, Perm.TEAM_MANAGE)
    form = ChannelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            notices.channel_create(actor=request.user, team=request.team, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, _("Channel added."))
            return redirect("console:notifications", team=request.team.slug)
    Membership.objects.filter(pk=request.membership.pk).update(notifications_seen_at=timezone.now())
    context: dict = {"form": form, "can_manage": can_manage, "events": notices.EVENTS}
    if can_manage:
        channels = list(request.team.notification_channels.all())
        context["channels"] = [(c, notices.channel_display(c)) for c in channels]
        context["deliveries"] = (
            NotificationDelivery.objects.filter(channel__team=request.team)
            .select_related("channel", "notification")
            .order_by("-id")[:50]
        )
    return render_page(
        request,
        "console/notifications.html",
        request.team.notifications.all(),
        context,
        name="notifications",
    )


@team_view(write=Perm.TEAM_MANAGE)
@require_POST
def notification_channel_delete(request: HttpRequest, channel_id: int) -> HttpResponse:
    from console import notifications as notices

    channel = get_object_or_404(request.team.notification_channels, pk=channel_id)
    notices.channel_delete(actor=request.user, channel=channel)
    messages.success(request, _("Channel deleted."))
    return redirect("console:notifications", team=request.team.slug)


@team_view()
def team_usage(request: HttpRequest) -> HttpResponse:
    """The team's device-hours in a month (by device type, user and job) against its quotas,
    the last months' device-hours, its endpoints' requests and tokens, its storage; the
    month's lines as CSV or XLSX (``?format=``) for chargeback."""
    start = _month(request.GET.get("month"))
    if request.GET.get("format") in ("csv", "xlsx"):
        return _usage_file(start, request.GET["format"], request.team)
    uses = usage.month_uses(start, request.team)
    by_device = {device: hours for (_team, device), hours in usage.summary(uses, "team")}
    devices = []
    hours_quota = request.team.device_hours_quota or {}
    for d in sorted(set(by_device) | set(hours_quota)):
        hours, quota = by_device.get(d, 0.0), hours_quota.get(d)
        percent = min(100, round(100 * hours / quota)) if quota else None
        devices.append({"device": d, "hours": hours, "quota": quota, "percent": percent})
    return render(
        request,
        "console/usage.html",
        {
            **_months(start),
            "devices": devices,
            "by_user": usage.summary(uses, "user"),
            "by_job": usage.summary(uses, "job"),
            "serving": [r for collect in usage.serving_usage for r in collect(request.team, start)],
            "months": usage.monthly_hours(request.team),
            "storage": {
                quotas.storage_label(kind): size
                for kind, size in quotas.team_storage_usage(request.team).items()
            },
            "storage_quota": quotas.team_storage_quota(request.team),
            "jobs_at_once": usage.concurrency_limit(request.team),
        },
    )


@staff_required
def site_usage(request: HttpRequest) -> HttpResponse:
    """Site staff: every team's device-hours in a month, and each team's quotas."""
    start = _month(request.GET.get("month"))
    if request.GET.get("format") in ("csv", "xlsx"):
        return _usage_file(start, request.GET["format"])
    device_types = sorted(hardware.profiles())
    posted = (
        QuotaForm(request.POST, device_types=device_types) if request.method == "POST" else None
    )
    if posted is not None and posted.is_valid():
        team = get_object_or_404(Team, slug=posted.cleaned_data["team"])
        try:
            services.team_quotas_set(
                actor=request.user,
                team=team,
                max_concurrent_jobs=posted.cleaned_data["max_concurrent_jobs"],
                device_hours_quota=posted.device_hours(),
                storage_quota_gb=posted.cleaned_data["storage_quota_gb"],
                max_endpoints=posted.cleaned_data["max_endpoints"],
                max_replicas=posted.cleaned_data["max_replicas"],
            )
        except ValidationError as exc:
            messages.error(request, error_text(exc))
        else:
            messages.success(request, _("Quotas of %(team)s saved.") % {"team": team.name})
            return redirect("console:site_usage")
    elif posted is not None:
        messages.error(request, error_text(ValidationError(list(posted.errors.values()))))
    totals: dict[str, dict[str, float]] = {}
    for (team_name, device), hours in usage.summary(usage.month_uses(start), "team"):
        totals.setdefault(team_name, {})[device] = hours
    teams = []
    for team in Team.objects.order_by("name"):
        initial = {
            "team": team.slug,
            "max_concurrent_jobs": team.max_concurrent_jobs,
            "storage_quota_gb": team.storage_quota_gb,
            "max_endpoints": team.max_endpoints,
            "max_replicas": team.max_replicas,
            **{f"hours_{d}": h for d, h in (team.device_hours_quota or {}).items()},
        }
        teams.append(
            {
                "team": team,
                "hours": totals.pop(team.name, {}),
                "form": QuotaForm(
                    initial=initial, device_types=device_types, auto_id=f"id_{team.slug}_%s"
                ),
            }
        )
    return render(
        request,
        "console/site_usage.html",
        {**_months(start), "teams": teams, "gone": totals, "device_types": device_types},
    )
