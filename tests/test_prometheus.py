"""The platform as an operator's Prometheus sees it: a real Prometheus server (Debian's package)
started with the shipped configuration and rules (platform/monitoring/, its intervals shortened)
scrapes the console and the suite's serving host with the metrics token, and the test reads
the series through Prometheus's HTTP API; a node that stopped beating fires its alert; every
panel of the shipped Grafana dashboard is a query Prometheus answers."""

import json
import os
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
import yaml
from django.conf import settings
from django.utils import timezone

from console import hardware
from console.models import Device, Node
from console.services import node_register
from runtime.net import free_port
from tests.helpers.serving import KEY, load, route
from tests.helpers.system import ROOT
from tests.helpers.workers import suite_database_url

MONITORING = ROOT / "platform" / "monitoring"
PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"

pytestmark = pytest.mark.django_db(transaction=True)


def _needs(binary: str) -> None:
    if not Path(binary).exists():
        message = f"{binary} is missing (apt-get install prometheus; make install-test does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait(self, what, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while True:
            found = what()
            if found:
                return found
            assert time.monotonic() < deadline, f"not seen in {timeout} s: {what.__doc__}"
            time.sleep(0.5)


@pytest.fixture
def prometheus(tmp_path, live_server, serving_host):
    """Prometheus with the shipped configuration, rules and dashboard's queries: targets the
    test's console and serving host, the token in metrics.token, intervals of a few seconds."""
    _needs(PROMETHEUS)
    conf = tmp_path / "monitoring"
    shutil.copytree(MONITORING, conf, ignore=shutil.ignore_patterns("metrics.token"))
    config = yaml.safe_load((conf / "prometheus.yml").read_text())
    config["global"] = {
        "scrape_interval": "3s",
        "scrape_timeout": "3s",
        "evaluation_interval": "1s",
    }
    (conf / "prometheus.yml").write_text(yaml.safe_dump(config))
    (conf / "metrics.token").write_text(settings.METRICS_TOKEN)
    (conf / "metrics.token").chmod(0o600)
    console = urlparse(live_server.url).netloc
    (conf / "targets" / "console.yml").write_text(json.dumps([{"targets": [console]}]))
    serving = f"127.0.0.1:{serving_host.port}"
    (conf / "targets" / "serving.yml").write_text(json.dumps([{"targets": [serving]}]))
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={conf / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"{server.url}/-/ready", timeout=1).ok:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"prometheus did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.3)
    yield server
    proc.terminate()
    proc.wait(timeout=20)


def test_prometheus_scrapes_the_platform_and_a_silent_node_fires_its_alert(
    prometheus, fresh_host, exports, team, owner, celery_worker_process
):
    from labeling.datasets import dataset_create
    from labeling.models import ImportJob
    from tests.helpers.data import version_for
    from training.jobs import training_job_submit
    from training.models import TrainingJob

    live = node_register(name="n-live", devices=hardware.parse_devices("npu:2"), simulated=True)
    node_register(name="n-silent", devices=hardware.parse_devices("npu:1"), simulated=True)
    Node.objects.filter(name="n-silent").update(
        heartbeat_at=timezone.now() - timezone.timedelta(minutes=10)
    )
    dataset = dataset_create(actor=owner, team=team, name="d", task_kind="text_classification")
    version = version_for(dataset, owner, 40)
    training_job_submit(actor=owner, team=team, dataset_version=version, device_type="npu")
    # Names of this test's own: the suite's serving host keeps every endpoint's counters since
    # it started, other tests' "reviews" among them.
    name, rev = f"prom-{uuid.uuid4().hex[:8]}", f"rev-{uuid.uuid4().hex[:8]}"
    load(fresh_host, rev, exports("text_classification"))
    route(fresh_host, name, {rev: 100})
    for text in ("物流很快，包装完好", "质量太差了", "还会再买"):
        assert fresh_host.predict(name, {"inputs": [text]}, KEY).status_code == 200
    assert fresh_host.predict(name, {"inputs": "not a list"}, KEY).status_code == 400

    def scraped():
        """both targets up"""
        up = {r["metric"]["job"]: r["value"][1] for r in prometheus.query("up")}
        return up.get("platform") == "1" and up.get("serving") == "1"

    prometheus.wait(scraped)

    def endpoint_seen():
        """the endpoint's calls"""
        return prometheus.value(f'sum(platform_endpoint_requests_total{{endpoint="{name}"}})') == 4

    prometheus.wait(endpoint_seen)
    assert (
        prometheus.value(
            f'sum(platform_endpoint_latency_seconds_count{{endpoint="{name}",revision="{rev}"}})'
        )
        == 3
    )
    assert prometheus.value(f'platform_endpoint_errors_total{{endpoint="{name}",code="4xx"}}') == 1
    assert prometheus.value(f'platform_revision_batched_inputs_total{{revision="{rev}"}}') == 3

    def platform_seen():
        """the console's figures"""
        return prometheus.value('platform_training_jobs{status="queued",device_type="npu"}')

    # As the database has them (a worker of an earlier test may have left its node behind).
    queued = TrainingJob.objects.filter(status="queued", device_type="npu").count()
    assert prometheus.wait(platform_seen) == queued >= 1
    free = Device.objects.filter(device_type="npu", holder="").count()
    assert prometheus.value('platform_devices{device_type="npu",state="free"}') == free >= 3
    beats = prometheus.query("platform_node_last_heartbeat_timestamp_seconds")
    assert {r["metric"]["node"] for r in beats} >= {"n-live", "n-silent"}
    assert live.heartbeat_at.timestamp() == pytest.approx(
        prometheus.value('platform_node_last_heartbeat_timestamp_seconds{node="n-live"}'), abs=5
    )
    assert prometheus.value("platform_scrape_errors") == 0

    def console_counted():
        """Django's own figures: the console's scrapes (each counted once it has answered, so
        from the second scrape on)"""
        return prometheus.value(
            'django_http_responses_total_by_status_view_method_total{view="metrics"}'
        )

    assert prometheus.wait(console_counted) >= 1
    assert prometheus.value('platform_celery_queue_workers{queue="default"}') >= 1
    imported = ImportJob.objects.filter(status="succeeded", finished_at__isnull=False).count()
    assert prometheus.value('platform_import_duration_seconds_count{status="succeeded"}') == (
        imported
    )
    assert imported >= 1

    def alert_fired():
        """PlatformNodeSilent firing"""
        alerts = requests.get(f"{prometheus.url}/api/v1/alerts", timeout=10).json()
        return [
            a
            for a in alerts["data"]["alerts"]
            if a["labels"]["alertname"] == "PlatformNodeSilent" and a["state"] == "firing"
        ]

    fired = {a["labels"]["node"] for a in prometheus.wait(alert_fired)}
    assert "n-silent" in fired and "n-live" not in fired

    rules = requests.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert all(r["health"] != "err" for g in rules for r in g["rules"]), rules

    # Every panel of the dashboard is a query Prometheus accepts; the endpoint's and the jobs'
    # panels show this platform's series.
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    answered = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            answered[panel["title"]] = prometheus.query(target["expr"])
    assert answered["Training jobs by status"] and answered["Devices held and free"]
    requests_panel = next(p for p in dashboard["panels"] if p["title"] == "Endpoint requests/s")

    def rate_seen():
        """this endpoint's rate (two scrapes of its counter)"""
        series = prometheus.query(requests_panel["targets"][0]["expr"])
        return {"endpoint": name} in [r["metric"] for r in series]

    prometheus.wait(rate_seen)
    console_panel = next(p for p in dashboard["panels"] if p["title"].startswith("Console req"))

    def console_rate_seen():
        """the console's requests/s panel with its scrapes' 200s (a rate: two counted)"""
        statuses = prometheus.query(console_panel["targets"][0]["expr"])
        return {"status": "200"} in [r["metric"] for r in statuses]

    prometheus.wait(console_rate_seen)


def test_the_alert_rules_pass_promtool_and_their_unit_tests():
    _needs(PROMTOOL)
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts.test.yml"],
        capture_output=True,
        text=True,
        cwd=MONITORING,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_console_counts_the_requests_of_every_gunicorn_worker(tmp_path):
    """gunicorn as the platform runs it (gunicorn.conf.py from the working directory), two
    worker processes: /metrics, whichever worker answers it, counts every worker's requests."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": suite_database_url(),
        "TMPDIR": str(tmp_path),  # where gunicorn.conf.py makes the workers' shared directory
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with open(tmp_path / "gunicorn.log", "wb") as log:
        proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/gunicorn"), "console.wsgi:application", "--bind",
             f"127.0.0.1:{port}", "--workers", "2", "--threads", "1"],
            cwd=ROOT, env=env, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"

            def logins() -> float:
                """The console's login pages served, as /metrics says."""
                r = requests.get(
                    f"{url}/metrics",
                    headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"},
                    timeout=10,
                )
                assert r.status_code == 200, r.text[:500]
                return sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in r.text.splitlines()
                    if line.startswith("django_http_responses_total_by_status_view_method_total{")
                    and 'view="console:login"' in line
                )

            deadline = time.monotonic() + 60
            while True:
                try:
                    before = logins()
                    break
                except requests.RequestException:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.3)
            # Concurrent calls, so that both workers answer some (each serves one at a time).
            with ThreadPoolExecutor(8) as pool:
                calls = pool.map(lambda _: requests.get(f"{url}/login/", timeout=30), range(40))
                codes = [r.status_code for r in calls]
            assert codes == [200] * 40
            (shared,) = tmp_path.glob("platform-metrics-*")
            counting = {f.name.rsplit("_", 1)[1] for f in shared.glob("counter_*.db")}
            assert len(counting) == 2, counting  # both workers count
            # Whichever worker answers /metrics, it counts all 40.
            assert {logins() for _ in range(6)} == {before + 40}
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert not shared.exists()  # removed when gunicorn stops
