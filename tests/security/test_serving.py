"""The serving host against callers without a key (or with the wrong secret), through a real
host process on its own port with ``SERVING_MAX_BODY_MB=1``: the key is checked before any of
the body is read, bodies beyond the limit are refused without being held, endpoint names cannot
be told from the answers, the health routes say only ready or not, and the management secret
opens no inference API. And the console shows a new endpoint key without keeping it anywhere."""

import hashlib
import http.client
import os
import socket
import time
import uuid

import psutil
import pytest
import requests
from django.conf import settings

from tests.deployment.fixtures import ServingHostProcess

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = pytest.mark.xdist_group("security-serving")

KEY = "mpe_security-key-0123456789"
OTHER_KEY = "mpe_other-endpoint-key-0123"
LIMIT = 1 << 20  # SERVING_MAX_BODY_MB=1
MB = 1 << 20


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class LimitedHost(ServingHostProcess):
    """A serving host of its own (a free port, a 1 MB body limit)."""

    def __init__(self) -> None:
        super().__init__()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        os.environ["SERVING_MAX_BODY_MB"] = "1"
        try:
            super().start()
        finally:
            del os.environ["SERVING_MAX_BODY_MB"]

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss


@pytest.fixture(scope="module")
def host(exports):
    """The host with a classifier loaded behind endpoint "guarded" (KEY, rate-limited to one
    call a second) and an endpoint "neighbour" with another key."""
    host = LimitedHost()
    host.start()
    r = host.manage(
        "PUT", "/manage/revisions/rev-guarded", {"export_dir": str(exports("text_classification"))}
    )
    assert r.status_code == 202, r.text
    assert host.wait_ready("rev-guarded")["state"] == "ready"
    for name, key in (("guarded", KEY), ("neighbour", OTHER_KEY)):
        r = host.manage(
            "PUT",
            f"/manage/endpoints/{name}",
            {"revisions": {"rev-guarded": 100}, "keys": {_sha(key): {"id": 1, "rate_per_s": 1}}},
        )
        assert r.status_code == 204, r.text
    yield host
    host.stop()


def _open(host: LimitedHost, path: str, headers: dict[str, str]) -> socket.socket:
    """A POST whose headers are sent and whose body is not (yet)."""
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=10)
    head = {"Host": "127.0.0.1", "Content-Type": "application/json", **headers}
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    sock.sendall("\r\n".join(lines).encode())
    return sock


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """The answer, which must come within 10 s of what was sent so far (else socket.timeout)."""
    response = http.client.HTTPResponse(sock, method="POST")
    response.begin()
    return response.status, response.read()


def _junk(sock: socket.socket, total: int, chunked: bool) -> int:
    """Send up to ``total`` bytes of junk body; how many the host took before it hung up."""
    sent, block = 0, b"\xff" * (256 * 1024)
    try:
        while sent < total:
            sock.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            sent += len(block)
    except OSError:
        pass
    return sent


INFERENCE = ["/v1/endpoints/guarded:predict", "/v1/chat/completions", "/v1/completions"]


@pytest.mark.parametrize("path", INFERENCE)
def test_a_huge_body_without_a_key_is_refused_before_it_is_read(host, path):
    """A 1 GB Content-Length and a chunked stream of junk, without a key and with a wrong one:
    401 arrives before a byte of the body is sent, and the host's memory does not grow while
    the junk is pushed at it."""
    before = host.rss()
    for auth in ({}, {"Authorization": "Bearer mpe_wrong"}):
        for framing in ({"Content-Length": str(10**9)}, {"Transfer-Encoding": "chunked"}):
            sock = _open(host, path, {**auth, **framing})
            status, body = _answer(sock)  # nothing of the body was sent
            assert status == 401, body
            _junk(sock, 8 * MB, chunked="Transfer-Encoding" in framing)
            sock.close()
    grown = host.rss() - before
    assert grown < 4 * MB, f"the host grew by {grown / MB:.1f} MB"


@pytest.mark.parametrize("path", INFERENCE[:2])
def test_a_body_over_the_limit_gets_413_even_with_a_key(host, path):
    """With a valid key: a Content-Length over SERVING_MAX_BODY_MB gets 413 before the body is
    sent; a chunked body is cut off with 413 once it passes the limit, and the host held no
    more than the limit of it."""
    time.sleep(1.1)  # the key's rate: one call a second
    sock = _open(host, path, {"Authorization": f"Bearer {KEY}", "Content-Length": str(10**9)})
    status, body = _answer(sock)
    assert status == 413 and b"SERVING_MAX_BODY_MB" in body, body
    sock.close()

    time.sleep(1.1)
    before = host.rss()
    sock = _open(host, path, {"Authorization": f"Bearer {KEY}", "Transfer-Encoding": "chunked"})
    sent = _junk(sock, 6 * MB, chunked=True)
    status, body = _answer(sock)
    assert status == 413, body
    assert sent > 2 * LIMIT
    sock.close()
    grown = host.rss() - before
    assert grown < LIMIT + 3 * MB, f"the host grew by {grown / MB:.1f} MB"
    # A body within the limit still passes.
    time.sleep(1.1)
    r = requests.post(
        host.url + INFERENCE[0],
        json={"inputs": ["很好" * 1000] * 10},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", INFERENCE[:2])
def test_a_deeply_nested_body_gets_400_not_a_crash(host, path):
    """With a valid key: JSON nested 100,000 deep (200 KB, within the limit) overflows the
    parser's recursion; the caller hears 400 saying so, and the host still answers."""
    time.sleep(1.1)  # the key's rate: one call a second
    nested = b"[" * 100_000 + b"]" * 100_000
    r = requests.post(
        host.url + path,
        data=nested,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.json()["error"]["message"], r.text
    time.sleep(1.1)
    r = requests.post(
        host.url + INFERENCE[0],
        json={"inputs": ["很好"]},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def _comparable(r: requests.Response) -> tuple:
    headers = {k.lower(): v for k, v in r.headers.items() if k.lower() != "date"}
    return r.status_code, r.content, sorted(headers.items())


def test_an_unknown_endpoint_and_a_bad_key_get_the_same_answer(host):
    """Endpoint names cannot be enumerated: an unknown endpoint, a wrong key, no key and
    another endpoint's key get byte-identical answers (the Date header aside), on the predict
    API and on the chat and completions APIs, whose body names the endpoint."""

    def predict(name: str, key: str | None) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return requests.post(
            f"{host.url}/v1/endpoints/{name}:predict",
            json={"inputs": ["好"]},
            headers=headers,
            timeout=10,
        )

    def chat(name: str, key: str | None) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": name, "messages": [{"role": "user", "content": "你好"}]}
        return requests.post(
            f"{host.url}/v1/chat/completions", json=body, headers=headers, timeout=10
        )

    for call in (predict, chat):
        answers = [
            call("no-such-endpoint", KEY),  # a valid key, an unknown endpoint
            call("no-such-endpoint", "mpe_wrong"),
            call("guarded", "mpe_wrong"),
            call("guarded", OTHER_KEY),  # the key of another endpoint
        ]
        assert answers[0].status_code == 401, answers[0].text
        assert all(_comparable(a) == _comparable(answers[0]) for a in answers), [
            _comparable(a) for a in answers
        ]
        assert _comparable(call("no-such-endpoint", None)) == _comparable(call("guarded", None))
        assert b"guarded" not in answers[0].content and b"no-such" not in answers[0].content


def test_the_health_routes_say_only_ready_or_not(host):
    """/healthz and /readyz tell whoever asks nothing but alive / ready: no endpoint names,
    revisions, versions, paths, boot ids. The management secret gets the revisions loading."""
    revision = f"rev-{uuid.uuid4().hex[:8]}"
    host.manage(
        "PUT",
        f"/manage/revisions/{revision}",
        {"export_dir": "/no/such/export", "model": "secret-model v7"},
    )
    for path in ("/healthz", "/readyz"):
        r = requests.get(host.url + path, timeout=5)
        assert set(r.json()) <= {"status", "ready"}, r.text
        for leak in ("guarded", "neighbour", "rev-", "secret-model", "/no/such", "boot"):
            assert leak not in r.text, (path, leak, r.text)
    r = requests.get(
        host.url + "/readyz",
        headers={"Authorization": f"Bearer {settings.SERVING_SECRET}"},
        timeout=5,
    )
    assert "loading" in r.json()
    # The rest is behind the secret.
    for path in ("/manage/state", "/manage/metrics", "/metrics"):
        r = requests.get(host.url + path, timeout=5)
        assert r.status_code in (401, 404) and "guarded" not in r.text, (path, r.text)
    host.manage("DELETE", f"/manage/revisions/{revision}")


def test_the_management_secret_opens_no_inference_api(host):
    """The management secret is no endpoint key: refused (the bad key's answer) on predict,
    chat and completions, so it bypasses no rate limit either. The platform's own key of an
    endpoint opens that endpoint only."""
    secret = settings.SERVING_SECRET
    bad = host.predict("guarded", {"inputs": ["好"]}, "mpe_wrong")
    for header in ({"Authorization": f"Bearer {secret}"}, {"X-API-Key": secret}):
        r = host.predict("guarded", {"inputs": ["好"]}, headers=header)
        assert _comparable(r) == _comparable(bad)
        for path in INFERENCE[1:]:
            body = {"model": "guarded", "messages": [{"role": "user", "content": "好"}]}
            r = requests.post(
                host.url + path, json={**body, "prompt": "好"}, headers=header, timeout=10
            )
            assert r.status_code == 401, r.text

    # The platform's key of "plat" (what the reconciler routes) opens "plat", not "guarded".
    from deployment.hosts import platform_key, platform_key_hash

    r = host.manage(
        "PUT",
        "/manage/endpoints/plat",
        {"revisions": {"rev-guarded": 100}, "keys": {}, "platform_key": platform_key_hash("plat")},
    )
    assert r.status_code == 204, r.text
    ok = host.predict("plat", {"inputs": ["好"]}, platform_key("plat"))
    assert ok.status_code == 200, ok.text
    other = host.predict("guarded", {"inputs": ["好"]}, platform_key("plat"))
    assert _comparable(other) == _comparable(bad)
    assert host.state()["endpoints"]["plat"]["key_expiry"] == {}  # not listed among the keys
    host.manage("DELETE", "/manage/endpoints/plat")


@pytest.mark.django_db
def test_a_new_endpoint_key_is_shown_without_being_kept_in_the_session(client, owner, team):
    """The console shows a new endpoint key in its answer to the form; the session store (and
    the next page) never holds it."""
    from django.contrib.sessions.models import Session
    from django.urls import reverse

    from deployment.models import Endpoint, EndpointKey

    endpoint = Endpoint.objects.create(team=team, name="shown", task_kind="text_classification")
    client.force_login(owner)
    r = client.post(reverse("deployment:key_create", args=[team.slug, endpoint.pk]), {"name": "a"})
    key = EndpointKey.objects.get(endpoint=endpoint)
    stored = [str(s.get_decoded()) + s.session_data for s in Session.objects.all()]
    assert stored and not any(key.prefix in s for s in stored), "the new key is in the session"
    assert r.status_code == 200
    plain = r.context["new_key"]
    assert plain.startswith(key.prefix) and plain in r.content.decode()
    assert key.key_hash == _sha(plain)
    assert "no-store" in r["Cache-Control"]
    page = client.get(reverse("deployment:endpoint", args=[team.slug, endpoint.pk]))
    assert plain not in page.content.decode()
