"""Notifications through real servers: a local SMTP server (aiosmtpd) and a local HTTP receiver
that checks each robot's proof the way DingTalk, WeCom and Feishu do. A team's owner adds the
channels on the console's page; a job that fails in the real train worker is told to the bell,
the DingTalk-style robot and the email list by the real Celery worker; a robot that refuses is
shown as a failed delivery and the job is not touched."""

import base64
import hashlib
import hmac
import json
import threading
import time
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from aiosmtpd.controller import Controller
from django.conf import settings
from django.db import transaction
from django.urls import reverse

from console.models import NotificationChannel, NotificationDelivery
from console.notifications import DeliveryFailed, deliver, notify
from tests.helpers.jobs import wait_for
from training.jobs import training_job_submit
from training.models import TrainingJob

DING_SECRET, FEISHU_SECRET, WECOM_KEY = "SECdingtalk0123", "feishu-secret-456", "wecom-key-789"


class Mailbox:
    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(
            (envelope.rcpt_tos, message_from_bytes(envelope.content, policy=policy.default))
        )
        return "250 OK"


@pytest.fixture(scope="session")
def smtp_server():
    """A real SMTP server on the suite's EMAIL_PORT (tests/settings.py)."""
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=settings.EMAIL_PORT)
    controller.start()
    yield mailbox
    controller.stop()


class Robots(BaseHTTPRequestHandler):
    """DingTalk (/dingtalk: 加签 in the query), WeCom (/wecom: the key), Feishu (/feishu: the
    signature in the body), each checked as the real service checks it; /broken answers 500."""

    received: list[tuple[str, dict]] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if url.path == "/broken":
            self._answer(500, {"error": "down"})
            return
        if url.path == "/dingtalk":
            stamp = query.get("timestamp", "0")
            expected = base64.b64encode(
                hmac.new(
                    DING_SECRET.encode(), f"{stamp}\n{DING_SECRET}".encode(), hashlib.sha256
                ).digest()
            ).decode()
            fresh = abs(time.time() * 1000 - int(stamp)) < 3600_000
            ok = (
                query.get("access_token") == "ding-token"
                and query.get("sign") == expected
                and fresh
            )
            self._answer(
                200, {"errcode": 0 if ok else 310000, "errmsg": "ok" if ok else "sign not match"}
            )
        elif url.path == "/wecom":
            ok = query.get("key") == WECOM_KEY and body.get("msgtype") == "markdown"
            self._answer(
                200,
                {"errcode": 0 if ok else 93000, "errmsg": "ok" if ok else "invalid webhook url"},
            )
        elif url.path == "/feishu":
            stamp = body.get("timestamp", "0")
            expected = base64.b64encode(
                hmac.new(f"{stamp}\n{FEISHU_SECRET}".encode(), b"", hashlib.sha256).digest()
            ).decode()
            ok = body.get("sign") == expected and abs(time.time() - int(stamp)) < 3600
            self._answer(
                200, {"code": 0 if ok else 19021, "msg": "success" if ok else "sign match fail"}
            )
        else:
            self._answer(404, {})
            return
        if ok:
            Robots.received.append((url.path, body))

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def robots():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Robots)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Robots.received = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def add_channel(client, team, **fields) -> None:
    page = reverse("console:notifications", args=[team.slug])
    response = client.post(page, fields)
    assert response.status_code == 302, response.content.decode()[-2000:]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker", "celery_worker_process")
def test_a_failed_job_rings_the_bell_pings_the_robot_and_sends_an_email(
    client, team, owner, smtp_server, robots
):
    from labeling.datasets import dataset_create
    from tests.helpers.data import version_for

    client.force_login(owner)
    add_channel(
        client, team, name="值班群", kind="dingtalk", events=["job_failed"],
        target=f"{robots}/dingtalk?access_token=ding-token", secret=DING_SECRET,
    )  # fmt: skip
    add_channel(
        client, team, name="组长邮箱", kind="email", events=["job_failed", "job_succeeded"],
        target="lead@example.com, ops@example.com",
    )  # fmt: skip
    dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    version = version_for(dataset, owner, 80)
    with transaction.atomic():
        job = training_job_submit(
            actor=owner, team=team, dataset_version=version, hyperparameters={"epochs": 1}
        )
        # A label set that lacks one of the data's labels: the runner fails, and says why.
        TrainingJob.objects.filter(pk=job.pk).update(labels=["正面", "中性"])
    job = wait_for(job)
    assert job.status == "failed"

    deliveries = NotificationDelivery.objects.filter(notification__team=team)
    deadline = time.monotonic() + 60
    while deliveries.exclude(status="sent").exists() or deliveries.count() < 2:
        assert time.monotonic() < deadline, list(deliveries.values("status", "error"))
        time.sleep(0.3)
    ((path, body),) = Robots.received
    assert path == "/dingtalk" and f"#{job.pk}" in body["markdown"]["text"]
    assert "KeyError" in body["markdown"]["text"]  # why it failed
    assert f"/t/{team.slug}/training/{job.pk}/" in body["markdown"]["text"]
    recipients, mail = next((r, m) for r, m in smtp_server.messages if f"#{job.pk}" in m["Subject"])
    assert sorted(recipients) == ["lead@example.com", "ops@example.com"]
    assert "KeyError" in mail.get_content()

    # The bell counts it until the owner looks.
    dashboard = client.get(reverse("console:dashboard", args=[team.slug])).content.decode()
    assert 'data-testid="unread">1<' in dashboard
    page = client.get(reverse("console:notifications", args=[team.slug])).content.decode()
    assert f"#{job.pk}" in page and 'data-status="sent"' in page
    dashboard = client.get(reverse("console:dashboard", args=[team.slug])).content.decode()
    assert 'data-testid="unread"' not in dashboard


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("celery_worker_process")
def test_wecom_and_feishu_robots_get_their_formats_and_proofs(client, team, owner, robots):
    client.force_login(owner)
    add_channel(
        client, team, name="企业微信", kind="wecom", events=["import_failed"],
        target=f"{robots}/wecom?key={WECOM_KEY}",
    )  # fmt: skip
    add_channel(
        client, team, name="飞书", kind="feishu", events=["import_failed"],
        target=f"{robots}/feishu", secret=FEISHU_SECRET,
    )  # fmt: skip
    with transaction.atomic():
        notify(
            team, "import_failed", "导入 评论 失败", body="第 3 行：缺少 label 列", subject="x:1"
        )
        notify(team, "import_failed", "导入 评论 失败", subject="x:1")  # told once
        notify(team, "job_succeeded", "no channel wants this")
    deadline = time.monotonic() + 30
    while len(Robots.received) < 2:
        assert time.monotonic() < deadline, list(NotificationDelivery.objects.values("error"))
        time.sleep(0.3)
    got = dict(Robots.received)
    assert "第 3 行：缺少 label 列" in got["/wecom"]["markdown"]["content"]
    assert got["/feishu"]["content"]["text"].startswith("导入 评论 失败")
    assert NotificationDelivery.objects.count() == 2


def test_a_robot_that_refuses_is_a_failed_delivery_shown_with_its_reason(
    client, team, owner, robots
):
    client.force_login(owner)
    add_channel(
        client, team, name="坏机器人", kind="dingtalk", events=["job_failed"],
        target=f"{robots}/broken",
    )  # fmt: skip
    add_channel(
        client, team, name="密钥错了", kind="dingtalk", events=["job_failed"],
        target=f"{robots}/dingtalk?access_token=ding-token", secret="wrong-secret",
    )  # fmt: skip
    notification = notify(team, "job_failed", "训练任务失败")
    broken, wrong = (
        notification.deliveries.get(channel__name=name) for name in ("坏机器人", "密钥错了")
    )
    with pytest.raises(DeliveryFailed):
        deliver(broken.pk, final=False)  # tried again later
    broken.refresh_from_db()
    assert (broken.status, broken.attempts) == ("pending", 1) and "HTTP 500" in broken.error
    deliver(broken.pk, final=True)
    deliver(wrong.pk, final=True)
    broken.refresh_from_db()
    wrong.refresh_from_db()
    assert broken.status == wrong.status == "failed"
    assert "sign not match" in wrong.error
    page = client.get(reverse("console:notifications", args=[team.slug])).content.decode()
    assert page.count('data-status="failed"') == 2 and "sign not match" in page
    assert not Robots.received
    assert NotificationChannel.objects.filter(team=team).count() == 2


def test_a_revision_that_fails_on_a_host_tells_the_team_once(team, owner):
    from deployment.models import Endpoint, Revision, ServingHost
    from deployment.reconcile import _placement
    from training.models import ModelVersion

    version = ModelVersion.objects.create(
        team=team, name="评论", number=1, task_kind="text_classification", backend="paddle",
        runtime="paddle_inference", storage_prefix="m/",
    )  # fmt: skip
    endpoint = Endpoint.objects.create(team=team, name="reviews", task_kind="text_classification")
    revision = Revision.objects.create(endpoint=endpoint, number=1, model_version=version)
    host = ServingHost.objects.create(url="http://127.0.0.1:1")
    _placement(revision, host, {"state": "ready"})
    _placement(revision, host, {"state": "failed", "error": "predictor died: out of memory"})
    _placement(revision, host, {"state": "failed", "error": "predictor died: out of memory"})
    (told,) = team.notifications.filter(event="endpoint_unhealthy")
    assert "reviews" in told.title and "out of memory" in told.body
    _placement(revision, host, {"state": "ready"})
    _placement(revision, host, {"state": "failed", "error": "again"})
    assert team.notifications.filter(event="endpoint_unhealthy").count() == 2
