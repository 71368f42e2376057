"""The serving host as a process: management API, inference over HTTP with concurrent clients
(answers equal the in-process predictor's), dynamic batching, input and key checks."""

import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.serving import KEY, KEY_HASH, bare_predict, load, route


def keys_with(key: str, rate_per_s: float) -> dict:
    """The keys of an endpoint: KEY, unlimited, and ``key`` limited to ``rate_per_s``."""
    limited = hashlib.sha256(key.encode()).hexdigest()
    return {KEY_HASH: {"id": 1, "rate_per_s": None}, limited: {"id": 2, "rate_per_s": rate_per_s}}


TEXTS = ["这个产品很好", "服务很差，退货", "总体来说满意", "讨厌", "推荐给朋友", "一般般吧质量糟糕"]


def test_concurrent_clients_get_the_in_process_models_answers(fresh_host, exports):
    export = exports("text_classification")
    rev = load(fresh_host, "rev-a", export, max_batch_size=8, max_wait_ms=20)
    assert rev["state"] == "ready", rev["error"]
    route(fresh_host, "reviews", {"rev-a": 100})
    texts = [f"{t}{i}" for i in range(8) for t in TEXTS]

    def call(text):
        r = fresh_host.predict("reviews", {"inputs": [text]}, KEY)
        assert r.status_code == 200, r.text
        assert r.headers["X-Revision"] == "rev-a"
        return r.json()["outputs"][0]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, texts))
    expected = bare_predict(export, texts)
    for got, want in zip(answers, expected, strict=True):
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)
        assert got["top_k"][0]["label"] == want["label"]
        assert sum(t["score"] for t in got["top_k"]) == pytest.approx(1.0, abs=1e-4)
    # Concurrent requests were batched: fewer batches than inputs.
    described = fresh_host.state()["revisions"]["rev-a"]
    assert described["batches"] < described["batched_inputs"] == len(texts)


def test_ner_spans_and_text_pairs_and_truncation(fresh_host, exports):
    ner, pair = exports("ner"), exports("text_pair")
    load(fresh_host, "rev-ner", ner)
    load(fresh_host, "rev-pair", pair)
    route(fresh_host, "places", {"rev-ner": 100})
    route(fresh_host, "pairs", {"rev-pair": 100})
    # The third is longer than the model's 64 tokens: read in 6 overlapping windows, not cut.
    texts = ["质量和服务北京很好", "总体上海不错", "这个" * 100 + "广州"]
    r = fresh_host.predict("places", {"inputs": texts}, KEY)
    assert r.status_code == 200, r.text
    outputs = r.json()["outputs"]
    want = bare_predict(ner, texts)
    for got, expected, text in zip(outputs, want, texts, strict=True):
        assert [(e["start"], e["end"], e["label"]) for e in got["entities"]] == [
            (e["start"], e["end"], e["label"]) for e in expected["entities"]
        ]
        for e in got["entities"]:
            assert e["text"] == text[e["start"] : e["end"]] and 0 < e["score"] <= 1
    assert any(e["label"] == "地点" for o in outputs for e in o["entities"])
    assert [o["truncated"] for o in outputs] == [False, False, False]
    assert [o.get("windows") for o in outputs] == [None, None, 6]

    items = [{"text_a": "服务很好", "text_b": "满意"}, {"text_a": "太差了", "text_b": "失望"}]
    r = fresh_host.predict("pairs", {"inputs": items, "top_k": 1}, KEY)
    assert r.status_code == 200, r.text
    assert [o["label"] for o in r.json()["outputs"]] == [
        p["label"] for p in bare_predict(pair, items)
    ]
    assert all(len(o["top_k"]) == 1 for o in r.json()["outputs"])
    r = fresh_host.predict("pairs", {"inputs": ["not a pair"]}, KEY)
    assert r.status_code == 422 and "text_a" in r.json()["error"]["message"]


def test_an_onnx_export_of_the_torch_backend_is_served(fresh_host, exports):
    export = exports("multi_label", backend="torch")
    rev = load(fresh_host, "rev-onnx", export, max_batch_size=4)
    assert rev["state"] == "ready", rev["error"]
    route(fresh_host, "tags", {"rev-onnx": 100})
    texts = ["物流快，很好", "很差，失望", "推荐，物流快"]
    r = fresh_host.predict("tags", {"inputs": texts}, KEY)
    assert r.status_code == 200, r.text
    for got, want in zip(r.json()["outputs"], bare_predict(export, texts), strict=True):
        assert got["labels"] == want["labels"]
        assert {s["label"]: s["score"] for s in got["scores"]} == pytest.approx(
            want["scores"], abs=1e-4
        )


BAD_INPUTS = [
    ({"inputs": []}, 400, "empty"),
    ({"texts": ["好"]}, 400, '"inputs"'),
    ({"inputs": "好"}, 400, "must be a list"),
    ({"inputs": ["好", 3]}, 422, "inputs[1] must be a string"),
    ({"inputs": ["好", "   "]}, 422, "inputs[1] is empty"),
    ({"inputs": ["好"] * 65}, 413, "at most 64"),
    ({"inputs": ["好"], "top_k": 0}, 400, "top_k"),
]


def test_bad_input_gets_a_4xx_that_says_why(fresh_host, exports):
    load(fresh_host, "rev-a", exports("text_classification"))
    route(fresh_host, "checked", {"rev-a": 100})
    for body, status, says in BAD_INPUTS:
        r = fresh_host.predict("checked", body, KEY)
        assert r.status_code == status, (body, r.text)
        assert says in r.json()["error"]["message"], body
    r = requests.post(
        f"{fresh_host.url}/v1/endpoints/checked:predict",
        data=b"{not json",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    counted = fresh_host.manage("GET", "/manage/metrics").json()["endpoints"]["checked"]["rev-a"]
    assert counted["client_errors"] == len(BAD_INPUTS) + 1


def test_keys_rate_limits_and_the_management_secret(fresh_host, exports):
    load(fresh_host, "rev-a", exports("text_classification"))
    slow = "mpe_slow-key"
    route(fresh_host, "keyed", {"rev-a": 100}, keys=keys_with(slow, rate_per_s=1))
    body = {"inputs": ["很好"]}
    assert fresh_host.predict("keyed", body).status_code == 401
    assert fresh_host.predict("keyed", body, "mpe_wrong").status_code == 401
    assert fresh_host.predict("nope", body, KEY).status_code == 401  # as a wrong key
    codes = [fresh_host.predict("keyed", body, slow).status_code for _ in range(4)]
    assert codes[0] == 200 and 429 in codes
    limited = fresh_host.predict("keyed", body, slow)
    if limited.status_code == 429:
        assert int(limited.headers["Retry-After"]) >= 1
    # Another key is not slowed down by the first one's limit.
    assert all(fresh_host.predict("keyed", body, KEY).status_code == 200 for _ in range(5))
    # The management API wants the secret.
    assert requests.get(fresh_host.url + "/manage/state", timeout=5).status_code == 401
    # Counters are the host's since it started: this endpoint's name is used by no other test.
    metrics = fresh_host.manage("GET", "/manage/metrics").json()["endpoints"]["keyed"]
    assert metrics[""]["unauthorized"] == 2 and metrics[""]["rate_limited"] >= 1
    assert metrics["rev-a"]["requests"] >= 6 and sum(metrics["rev-a"]["latency"]) >= 6


def test_traffic_goes_only_to_ready_revisions_by_weight(fresh_host, exports):
    load(fresh_host, "rev-a", exports("text_classification"))
    route(fresh_host, "reviews", {"rev-a": 50, "rev-b": 50})
    # rev-b is not loaded: all traffic goes to rev-a.
    seen = {
        fresh_host.predict("reviews", {"inputs": ["好"]}, KEY).headers["X-Revision"]
        for _ in range(10)
    }
    assert seen == {"rev-a"}
    load(fresh_host, "rev-b", exports("text_classification", seed=1))
    seen = [
        fresh_host.predict("reviews", {"inputs": ["好"]}, KEY).headers["X-Revision"]
        for _ in range(60)
    ]
    assert 10 < seen.count("rev-b") < 50
    # Weight 0 with a ready revision of weight 100: none to it.
    route(fresh_host, "reviews", {"rev-a": 0, "rev-b": 100})
    seen = {
        fresh_host.predict("reviews", {"inputs": ["好"]}, KEY).headers["X-Revision"]
        for _ in range(10)
    }
    assert seen == {"rev-b"}


def test_a_predictor_process_that_dies_is_replaced(fresh_host, exports):
    import os
    import signal

    import psutil

    load(fresh_host, "rev-a", exports("text_classification"))
    route(fresh_host, "reviews", {"rev-a": 100})
    assert fresh_host.predict("reviews", {"inputs": ["好"]}, KEY).status_code == 200
    [predictor] = [
        p
        for p in psutil.Process(fresh_host.proc.pid).children()
        if "serving.replica" in p.cmdline()
    ]
    os.kill(predictor.pid, signal.SIGKILL)
    # The call that finds the process dead fails (503, with the reason); the next ones wait
    # for the new process and are answered.
    first = fresh_host.predict("reviews", {"inputs": ["好"]}, KEY)
    assert first.status_code in (200, 503), first.text
    if first.status_code == 503:
        assert "died" in first.json()["error"]["message"]
    second = fresh_host.predict("reviews", {"inputs": ["很好"]}, KEY)
    assert second.status_code == 200, second.text
    assert fresh_host.state()["revisions"]["rev-a"]["state"] == "ready"


def test_a_model_that_fails_to_load_says_why(fresh_host, exports, tmp_path):
    import shutil

    broken = tmp_path / "export"
    shutil.copytree(exports("text_classification"), broken)
    (broken / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    rev = load(fresh_host, "rev-x", broken)
    assert rev["state"] == "failed"
    assert "vocab.txt does not match its sha256" in rev["error"]
    route(fresh_host, "broken", {"rev-x": 100})
    r = fresh_host.predict("broken", {"inputs": ["好"]}, KEY)
    assert r.status_code == 503 and "no revision" in r.json()["error"]["message"]


def test_a_predictor_killed_under_load_fails_only_the_requests_in_flight(fresh_host, exports):
    """Eight clients call without pause while one of two predictor processes is killed: the
    only failures are the requests that process held (503, "died"); the other process goes
    on answering, and the dead one is replaced."""
    import os
    import signal
    import threading
    import time

    import psutil

    load(fresh_host, "rev-a", exports("text_classification"), replicas=2, max_batch_size=4)
    route(fresh_host, "busy", {"rev-a": 100})
    clients, stop, codes = 8, threading.Event(), []

    def call() -> None:
        while not stop.is_set():
            r = fresh_host.predict("busy", {"inputs": ["很好"]}, KEY)
            codes.append((time.monotonic(), r.status_code, r.text))

    threads = [threading.Thread(target=call) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1)
    predictors = [
        p
        for p in psutil.Process(fresh_host.proc.pid).children()
        if "serving.replica" in p.cmdline()
    ]
    assert len(predictors) == 2
    killed_at = time.monotonic()
    os.kill(predictors[0].pid, signal.SIGKILL)
    # Until the clients had twice their number of answers after the kill.
    deadline = time.monotonic() + 60
    while sum(1 for at, code, _ in codes if at > killed_at and code == 200) <= 2 * clients:
        assert time.monotonic() < deadline, codes[-3:]
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=60)

    failed = [(at, code, text) for at, code, text in codes if code != 200]
    assert all(code == 503 and "died" in text for _, code, text in failed), failed[:3]
    # At most the batches in flight on the killed process: one request per client.
    assert len(failed) <= clients, len(failed)
    deadline = time.monotonic() + 90  # the replacement loads its model
    while fresh_host.state()["revisions"]["rev-a"]["replicas_ready"] < 2:
        assert time.monotonic() < deadline, fresh_host.state()["revisions"]["rev-a"]
        time.sleep(0.5)


def test_a_flood_from_one_key_is_limited_and_other_keys_are_not(fresh_host, exports):
    """Sixteen clients flood with one key limited to 5 requests a second: that key gets 429s
    beyond its rate, each with Retry-After; another key's calls meanwhile all pass."""
    import threading
    import time

    load(fresh_host, "rev-a", exports("text_classification"))
    flood_key = "mpe_flood-key"
    route(fresh_host, "flooded", {"rev-a": 100}, keys=keys_with(flood_key, rate_per_s=5))
    stop, flood, calm = threading.Event(), [], []

    def flooder() -> None:
        while not stop.is_set():
            r = fresh_host.predict("flooded", {"inputs": ["好"]}, flood_key)
            flood.append((r.status_code, r.headers.get("Retry-After")))

    threads = [threading.Thread(target=flooder) for _ in range(16)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while time.monotonic() - started < 3:
        calm.append(fresh_host.predict("flooded", {"inputs": ["很好"]}, KEY).status_code)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - started

    assert calm and set(calm) == {200}
    assert {code for code, _ in flood} == {200, 429}
    passed = sum(1 for code, _ in flood if code == 200)
    assert passed <= 5 * elapsed + 5  # the rate, and a burst of its size
    assert all(after and int(after) >= 1 for code, after in flood if code == 429)
    assert len(flood) > 2 * passed  # it was a flood: most calls were refused


def test_an_expired_key_is_refused_by_the_host_itself(fresh_host):
    """A key may expire between two convergences: the host checks the expiry it was given."""
    import time

    expired, later = "mpe_expired-key", "mpe_later-key"
    route(
        fresh_host,
        "expiring",
        {"rev-not-loaded": 100},
        keys={
            hashlib.sha256(expired.encode()).hexdigest(): {"id": 7, "expires_at": time.time() - 60},
            hashlib.sha256(later.encode()).hexdigest(): {"id": 8, "expires_at": time.time() + 3600},
            KEY_HASH: {"id": 9, "expires_at": None},
        },
    )
    body = {"inputs": ["很好"]}
    refused = fresh_host.predict("expiring", body, expired)
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert error["code"] == "unauthorized" and error["message"].startswith(
        "this API key expired on "
    )
    # The others pass the key check: no revision is loaded, so they hear "not ready".
    for key in (later, KEY):
        answer = fresh_host.predict("expiring", body, key)
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "not_ready"
    assert fresh_host.state()["endpoints"]["expiring"]["key_expiry"]["9"] is None
    counted = fresh_host.manage("GET", "/manage/metrics").json()["endpoints"]["expiring"][""]
    assert counted["unauthorized"] == 1
