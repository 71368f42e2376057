"""Prometheus's /metrics as an outsider or an endpoint's caller tries it: served only with the
metrics token, or, without one, only to the networks allowed, judged by the address the trusted
proxies report (a forged X-Forwarded-For is not believed); the serving host likewise."""

import requests
from django.conf import settings

from tests.helpers.serving import KEY

TOKEN = {"HTTP_AUTHORIZATION": f"Bearer {settings.METRICS_TOKEN}"}


def test_the_console_serves_its_metrics_only_with_the_token(client, settings):
    assert client.get("/metrics", **TOKEN).status_code == 200
    assert client.get("/metrics").status_code == 404  # loopback, but a token is configured
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {KEY}").status_code == 404


def test_without_a_token_only_the_allowed_networks_are_served(client, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW = "10.8.0.0/16"
    settings.TRUSTED_PROXIES = ["127.0.0.1"]
    assert client.get("/metrics", REMOTE_ADDR="10.8.3.4").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.9.3.4").status_code == 404
    # Through the proxy (nginx on loopback): the address it reports is the one judged.
    via = {"REMOTE_ADDR": "127.0.0.1"}
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="10.8.0.7", **via).status_code == 200
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.5", **via).status_code == 404
    # A client outside that claims to be allowed: its own header is not believed.
    forged = {"REMOTE_ADDR": "203.0.113.5", "HTTP_X_FORWARDED_FOR": "10.8.0.7"}
    assert client.get("/metrics", **forged).status_code == 404
    settings.METRICS_ALLOW = "not a network, 127.0.0.1/32"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_the_serving_host_serves_its_metrics_only_with_the_token(serving_host):
    url = f"{serving_host.url}/metrics"
    assert requests.get(url, timeout=10).status_code == 404
    for presented in (KEY, settings.SERVING_SECRET, "wrong"):
        answer = requests.get(url, headers={"Authorization": f"Bearer {presented}"}, timeout=10)
        assert answer.status_code == 404
    answer = requests.get(url, headers={"Authorization": TOKEN["HTTP_AUTHORIZATION"]}, timeout=10)
    assert answer.status_code == 200 and "platform_serving_host_start_time_seconds" in answer.text
