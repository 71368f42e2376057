"""A team admin's first session in the console, in a real browser."""

import json
import os
import re
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import Page, expect

from console.models import AuditEvent, Membership
from tests.helpers.browser import admin_creates_team, login, shot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def api_get(base: str, path: str, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_admin_first_session(page: Page, live_server, celery_worker_process):
    # No team yet: the console asks for one.
    admin_creates_team(page, "风控模型组")

    # The dashboard shows the database, Redis and the worker alive.
    health = page.get_by_test_id("health")
    for check in ("database", "redis", "worker"):
        expect(health.locator(f'li[data-check="{check}"]')).to_have_attribute("data-ok", "true")
        expect(health.locator(f'li[data-check="{check}"] .badge')).to_contain_text("正常")
    shot(page, "dashboard")

    # A site administrator creates an account, the owner invites it as annotator.
    page.get_by_role("link", name="账号管理").click()
    page.get_by_label("用户名").fill("wang")
    page.get_by_label("初始密码").fill("Wang-Pass-2026")
    page.get_by_role("button", name="创建账号").click()
    expect(page.get_by_role("status")).to_contain_text("账号“wang”已创建")
    page.goto("/")
    page.get_by_role("navigation").get_by_role("link", name="成员").click()
    invite = page.get_by_test_id("invite")
    invite.get_by_label("用户名").fill("wang")
    invite.get_by_label("角色").select_option("annotator")
    invite.get_by_role("button", name="邀请").click()
    expect(page.get_by_role("status")).to_contain_text("wang 已以标注员身份加入团队")
    expect(page.locator('tr[data-member="wang"]')).to_be_visible()
    # A typo gets a clear error and changes nothing.
    invite.get_by_label("用户名").fill("wnag")
    invite.get_by_role("button", name="邀请").click()
    expect(page.locator(".errorlist")).to_contain_text("没有用户名为“wnag”的有效账号")
    assert Membership.objects.filter(user__username="wang").count() == 1

    # An API token: created, shown once, used with the API, revoked.
    page.get_by_role("link", name="API 令牌").click()
    page.get_by_label("令牌名称").fill("ci-pipeline")
    page.get_by_role("button", name="创建令牌").click()
    key = page.get_by_test_id("new-token").inner_text().strip()
    assert key.startswith("mp_")
    status, teams = api_get(live_server.url, "/api/v1/teams/", key)
    assert status == 200
    assert [t["name"] for t in teams["results"]] == ["风控模型组"]
    slug = teams["results"][0]["slug"]
    status, members = api_get(live_server.url, f"/api/v1/teams/{slug}/members/", key)
    assert {m["username"]: m["role"] for m in members["results"]} == {
        "admin": "owner",
        "wang": "annotator",
    }
    # Shown in the answer to the form only: the page read again no longer has it.
    page.goto(page.url)
    expect(page.get_by_test_id("new-token")).to_have_count(0)
    page.locator('tr[data-token="ci-pipeline"]').get_by_role("button", name="撤销").click()
    expect(page.locator('tr[data-token="ci-pipeline"]')).to_contain_text("已撤销")
    assert api_get(live_server.url, "/api/v1/teams/", key)[0] == 401

    # The audit log has each of it.
    page.goto("/")
    page.get_by_role("link", name="审计日志").click()
    audit = page.get_by_test_id("audit")
    for action in ("login", "team.create", "membership.add", "token.create", "token.revoke"):
        expect(audit.locator(f'tr[data-action="{action}"]').first).to_be_visible()
    expect(audit.locator('tr[data-action="login"]').first).to_contain_text("127.0.0.1")
    page.get_by_label("操作").fill("token")
    page.get_by_role("button", name="筛选").click()
    expect(audit.locator("tbody tr")).to_have_count(2)
    shot(page, "audit")

    # English is one switch away, and back.
    page.get_by_test_id("language").select_option("en")
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    expect(page.get_by_role("navigation").get_by_role("link", name="Members")).to_be_visible()
    shot(page, "audit-en")
    page.get_by_test_id("language").select_option("zh-hans")
    expect(page.get_by_role("heading", name="审计日志")).to_be_visible()
    assert AuditEvent.objects.filter(action="token.revoke").count() == 1


def test_switching_teams_and_a_viewer_sees_no_write_controls(page: Page, make_user, make_team):
    viewer = make_user("zhou", password="Zhou-Pass-2026")
    make_team("Alpha", {viewer: "viewer"})
    make_team("Beta", {viewer: "maintainer"})
    login(page, "zhou", "Zhou-Pass-2026")
    expect(page.get_by_role("heading", name="Alpha")).to_be_visible()
    page.get_by_test_id("team-switcher").locator("select").select_option(label="Beta")
    expect(page.get_by_role("heading", name="Beta")).to_be_visible()
    page.get_by_test_id("team-switcher").locator("select").select_option(label="Alpha")
    expect(page.get_by_role("heading", name="Alpha")).to_be_visible()
    page.get_by_role("navigation").get_by_role("link", name="成员").click()
    expect(page.get_by_role("button", name="邀请", exact=True)).to_have_count(0)
    expect(page.get_by_role("link", name="审计日志")).to_have_count(0)
    # Switching team keeps the kind of page: Beta's members.
    page.get_by_test_id("team-switcher").locator("select").select_option(label="Beta")
    expect(page).to_have_url(re.compile(r"/t/beta/members/$"))


def test_a_directory_person_logs_in_and_finds_their_mapped_team(page: Page, directory):
    """The real OpenLDAP server (tests/helpers/ldap.py): 李娜 leads NLP in the directory."""
    from tests.helpers.ldap import PASSWORD

    page.goto("/login/")
    expect(page.get_by_test_id("login-methods")).to_contain_text("企业目录（LDAP）")
    login(page, "lina", "wrong-password")
    expect(page.get_by_text("用户名或密码错误")).to_be_visible()
    login(page, "lina", PASSWORD)
    expect(page.get_by_role("heading", name="nlp")).to_be_visible()
    page.get_by_role("navigation").get_by_role("link", name="成员").click()
    row = page.locator('tr[data-member="lina"]')
    expect(row.get_by_test_id("mapped")).to_contain_text("cn=nlp-leads")
    expect(row.locator("select")).to_have_count(0)
    shot(page, "directory-members")
    assert Membership.objects.get(user__username="lina").mapped_from.startswith("cn=nlp-leads,")


@pytest.fixture
def live_sso(live_server, settings):
    """A real OpenID provider with the live server registered as its client."""
    from tests.conftest import configure_sso
    from tests.helpers import oidc

    if reason := oidc.missing():
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)
    provider = oidc.Provider([live_server.url]).start()
    configure_sso(settings, provider)
    yield provider
    provider.stop()


def test_single_sign_on_in_and_out_through_the_provider(page: Page, live_sso):
    page.goto("/login/")
    page.get_by_test_id("sso-login").click()  # "使用 统一身份认证 登录"
    page.locator('input[name="login"]').fill("sub-lina")  # the provider's own page
    page.locator('input[name="password"]').fill("any")
    page.locator('button[type="submit"]').click()
    expect(page.get_by_role("heading", name="nlp")).to_be_visible()
    shot(page, "sso-dashboard")
    assert Membership.objects.get(user__username="lina").mapped_from == "nlp-leads"
    page.get_by_role("button", name="退出").click()
    expect(page).to_have_url(re.compile(f"^{re.escape(live_sso.issuer)}/session/end"))
    page.locator('button[autofocus], button[type="submit"]').first.click()  # "Yes, sign me out"
    expect(page).to_have_url(re.compile(r"/login/$"))
    # The provider asks again: its session ended with the platform's.
    page.get_by_test_id("sso-login").click()
    expect(page.locator('input[name="login"]')).to_be_visible()


def test_a_team_over_its_quota_sees_why_its_job_waits_and_what_it_used(
    page: Page, make_user, make_team, settings, celery_worker_process
):
    from django.utils import timezone, translation

    from console import hardware
    from console.models import DeviceUse
    from console.services import node_register
    from labeling.datasets import dataset_create
    from tests.helpers.data import version_for
    from training.jobs import training_job_submit
    from training.scheduling import JobMustWait, training_job_claim

    node_register(name=settings.NODE_NAME, devices=hardware.parse_devices("npu:2"), simulated=True)
    owner = make_user("zhao", password="Zhao-Pass-2026")
    team = make_team("NLP", {owner: "owner"})
    make_user("site-admin", password="Admin-Pass-2026", is_staff=True)
    now = timezone.now()
    DeviceUse.objects.create(
        team=team, team_name=team.name, user=owner, username="zhao", holder="h", label="#1 旧任务",
        device_type="npu", devices=2, started_at=now - timezone.timedelta(hours=3), ended_at=now,
    )  # fmt: skip
    # Site staff set the quota on the usage and quotas page.
    login(page, "site-admin", "Admin-Pass-2026")
    page.get_by_role("link", name="用量与配额").click()
    card = page.locator(f'section[data-team="{team.slug}"]')
    card.get_by_label("每月 npu 设备时").fill("5")
    card.get_by_role("button", name="保存配额").click()
    expect(page.get_by_text("已保存 NLP 的配额。")).to_be_visible()
    page.get_by_role("button", name="退出").click()

    dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    job = training_job_submit(
        actor=owner, team=team, dataset_version=version_for(dataset, owner, 80), device_type="npu"
    )
    # As a train worker claims it (in the site's language, zh-hans).
    with translation.override("zh-hans"), pytest.raises(JobMustWait):
        training_job_claim(job.pk, "w")
    login(page, "zhao", "Zhao-Pass-2026")
    page.goto(f"/t/{team.slug}/training/{job.pk}/")
    expect(page.get_by_test_id("waiting")).to_contain_text(
        "团队本月已用 6.0 设备时（npu），配额为 5 设备时"
    )
    page.get_by_role("navigation").get_by_role("link", name="用量").click()
    expect(page.locator('tr[data-device="npu"]')).to_contain_text("6.00")
    expect(page.get_by_test_id("usage-jobs")).to_contain_text("#1 旧任务")
    shot(page, "usage")
