"""The root URLconf: console pages, the REST API under /api/v1/, and each app's own urls.

Team-scoped routes carry the team's slug as ``team``: pages under ``t/<team>/``, the API under
``api/v1/teams/<team>/``. Apps write their full paths in their own ``urls.py``.
"""

from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.i18n import set_language
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import api, oidc, views

team_pages = [
    path("", views.dashboard, name="dashboard"),
    path("members/", views.members, name="members"),
    path("members/<int:membership_id>/role/", views.member_role, name="member_role"),
    path("members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path("audit/", views.audit, name="audit"),
    path("usage/", views.team_usage, name="usage"),
    path("notifications/", views.notifications, name="notifications"),
    path(
        "notifications/channels/<int:channel_id>/delete/",
        views.notification_channel_delete,
        name="notification_channel_delete",
    ),
]

console_pages = [
    path("", views.home, name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", views.Logout.as_view(), name="logout"),
    # Single sign-on (console/oidc.py): to the provider and back.
    path("oidc/authenticate/", oidc.OIDCLogin.as_view(), name="oidc_login"),
    path("oidc/callback/", oidc.OIDCCallback.as_view(), name="oidc_callback"),
    path("health/", views.health_panel, name="health"),
    path("nodes/", views.nodes, name="nodes"),
    path("teams/new/", views.team_create, name="team_create"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    path("password/", views.password_change, name="password_change"),
    path("users/", views.users, name="users"),
    path("users/<int:user_id>/password/", views.user_password, name="user_password"),
    path("users/<int:user_id>/active/", views.user_active, name="user_active"),
    path("users/<int:user_id>/tokens/", views.user_tokens, name="user_tokens"),
    path(
        "users/<int:user_id>/tokens/<int:token_id>/revoke/",
        views.user_token_revoke,
        name="user_token_revoke",
    ),
    path("users/lockouts/clear/", views.lockout_clear, name="lockout_clear"),
    path("usage/", views.site_usage, name="site_usage"),
    path("t/<slug:team>/", include(team_pages)),
]

api_v1 = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("me/", api.MeView.as_view(), name="me"),
    path("health/", api.HealthView.as_view(), name="health"),
    path("nodes/", api.NodeList.as_view(), name="nodes"),
    path("tokens/", api.TokenListCreate.as_view(), name="tokens"),
    path("tokens/<int:token_id>/", api.TokenRevoke.as_view(), name="token"),
    path("teams/", api.TeamListCreate.as_view(), name="teams"),
    path("teams/<slug:team>/", api.TeamDetail.as_view(), name="team"),
    path("teams/<slug:team>/members/", api.MemberListCreate.as_view(), name="members"),
    path(
        "teams/<slug:team>/members/<int:membership_id>/",
        api.MemberDetail.as_view(),
        name="member",
    ),
    path("teams/<slug:team>/audit/", api.AuditList.as_view(), name="audit"),
    path("teams/<slug:team>/usage/", api.TeamUsage.as_view(), name="usage"),
    # Site staff only (404 to anybody else).
    path("users/<int:user_id>/tokens/", api.UserTokenList.as_view(), name="user_tokens"),
    path(
        "users/<int:user_id>/tokens/<int:token_id>/",
        api.UserTokenRevoke.as_view(),
        name="user_token",
    ),
    path("users/<int:user_id>/active/", api.UserActive.as_view(), name="user_active"),
    path("lockouts/", api.LockoutList.as_view(), name="lockouts"),
    path("quotas/", api.Quotas.as_view(), name="quotas"),
]

urlpatterns = [
    path("i18n/setlang/", set_language, name="set_language"),
    path("metrics", views.metrics, name="metrics"),  # Prometheus's default path
    path("api/v1/", include((api_v1, "api"))),
    path("", include((console_pages, "console"))),
    path("", include("labeling.urls")),
    path("", include("training.urls")),
    path("", include("deployment.urls")),
]

handler500 = "console.views.server_error"
