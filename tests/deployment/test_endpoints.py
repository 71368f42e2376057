"""Endpoints on a real serving host: deploy, call with a key, canary, promote, roll back, the
reconciler after a host restart, revoked keys, metrics, and what is refused."""

import time
from collections import Counter

import pytest
from django.core.exceptions import ValidationError

from console.models import AuditEvent
from deployment import selectors
from deployment.hosts import endpoint_predict
from deployment.keys import endpoint_key_create, endpoint_key_revoke
from deployment.metrics import metrics_collect, metrics_prune
from deployment.models import MetricSample, Placement, ServingHost
from deployment.reconcile import endpoints_reconcile
from deployment.rollout import (
    endpoint_delete,
    endpoint_deploy,
    endpoint_rollback,
    revision_add,
    revision_promote,
)
from tests.helpers.serving import converge
from training.registry import model_version_delete


def revisions_seen(host, name: str, key: str, n: int = 40) -> Counter:
    seen = Counter()
    for _ in range(n):
        r = host.predict(name, {"inputs": ["服务很好"]}, key)
        assert r.status_code == 200, r.text
        seen[r.headers["X-Revision"]] += 1
    return seen


def test_deploy_canary_promote_roll_back(db, fresh_host, owner, team, model_version):
    v1, v2 = model_version(seed=0), model_version(seed=1)
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=v1)
    assert endpoint.name == "reviews"
    key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
    assert plain.startswith("mpe_") and plain not in key.key_hash
    converge(fresh_host, endpoint)
    first = endpoint.revisions.get()
    assert revisions_seen(fresh_host, "reviews", plain, 5) == {first.key: 5}

    canary = revision_add(actor=owner, endpoint=endpoint, model_version=v2, weight=30)
    first.refresh_from_db()
    assert (first.weight, canary.weight) == (70, 30)
    converge(fresh_host, endpoint)
    seen = revisions_seen(fresh_host, "reviews", plain, 60)
    assert seen[canary.key] > 5 and seen[first.key] > 20

    revision_promote(actor=owner, revision=canary)
    converge(fresh_host, endpoint)
    assert revisions_seen(fresh_host, "reviews", plain, 10) == {canary.key: 10}
    assert set(fresh_host.state()["revisions"]) == {canary.key}  # the old one was unloaded

    back = endpoint_rollback(actor=owner, endpoint=endpoint)
    assert back == first
    converge(fresh_host, endpoint)
    assert revisions_seen(fresh_host, "reviews", plain, 10) == {first.key: 10}
    endpoint.refresh_from_db()
    assert endpoint.stable_revision == first

    # A canary rolled back: all traffic returns to the stable revision at once.
    revision_add(actor=owner, endpoint=endpoint, model_version=v2, weight=50)
    endpoint_rollback(actor=owner, endpoint=endpoint)
    first.refresh_from_db()
    assert first.weight == 100
    assert list(endpoint.revisions.filter(status="active")) == [first]
    with pytest.raises(ValidationError, match="nothing to roll back"):
        endpoint_rollback(actor=owner, endpoint=endpoint)

    actions = list(
        AuditEvent.objects.filter(team=team, action__startswith="endpoint.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "endpoint.deploy",
        "endpoint.key_create",
        "endpoint.canary",
        "endpoint.promote",
        "endpoint.rollback",
        "endpoint.canary",
        "endpoint.rollback",
    ]


def test_an_int8_version_serves_as_a_canary_beside_its_parent(
    db, fresh_host, owner, team, model_version
):
    # Compressed by the runner (runtime.compress): an ONNX Runtime export of INT8 weights.
    fp32, int8 = model_version(), model_version(int8=True)
    assert int8.runtime == "onnxruntime" and int8.manifest["quantization"] == "int8-dynamic"
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=fp32)
    _key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
    canary = revision_add(actor=owner, endpoint=endpoint, model_version=int8, weight=50)
    converge(fresh_host, endpoint)
    answers: dict[str, set] = {}
    for _ in range(40):
        r = fresh_host.predict("reviews", {"inputs": ["服务很好", "太差了"]}, plain)
        assert r.status_code == 200, r.text
        labels = tuple(p["label"] for p in r.json()["outputs"])
        answers.setdefault(r.headers["X-Revision"], set()).add(labels)
    # Both revisions answered, and the same: the INT8 model decides as its parent.
    assert canary.key in answers and len(answers) == 2, answers
    assert len(set.union(*answers.values())) == 1, answers


def test_a_restarted_host_is_restored_and_revoked_keys_refused(
    db, fresh_host, owner, team, model_version
):
    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=model_version(), max_batch_size=4
    )
    key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
    converge(fresh_host, endpoint)
    assert fresh_host.predict(endpoint.name, {"inputs": ["好"]}, plain).status_code == 200
    boot = ServingHost.objects.get().boot_id

    fresh_host.kill()
    endpoints_reconcile()
    host = ServingHost.objects.get()
    assert not host.reachable and "unreachable" in host.error
    fresh_host.start()
    converge(fresh_host, endpoint)
    assert ServingHost.objects.get().boot_id != boot
    assert fresh_host.predict(endpoint.name, {"inputs": ["好"]}, plain).status_code == 200

    endpoint_key_revoke(actor=owner, key=key)
    endpoints_reconcile()
    r = fresh_host.predict(endpoint.name, {"inputs": ["好"]}, plain)
    assert r.status_code == 401


def test_metrics_are_scraped_into_the_endpoints_charts(db, fresh_host, owner, team, model_version):
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=model_version())
    _key, plain = endpoint_key_create(actor=owner, endpoint=endpoint, name="app")
    converge(fresh_host, endpoint)
    # The host counts since it started (earlier tests too); the platform stores differences.
    metrics_collect()
    before = selectors.endpoint_metrics(endpoint, minutes=10)["total"]
    for _ in range(5):
        assert fresh_host.predict(endpoint.name, {"inputs": ["好", "差"]}, plain).ok
    fresh_host.predict(endpoint.name, {"inputs": ["好"]}, "mpe_wrong")
    fresh_host.predict(endpoint.name, {"inputs": []}, plain)
    assert metrics_collect() >= 1
    figures = selectors.endpoint_metrics(endpoint, minutes=10)
    total = figures["total"]

    def added(name):
        return total[name] - before[name]

    assert (added("requests"), added("inputs")) == (7, 10)
    assert (added("unauthorized"), added("client_errors"), added("errors")) == (1, 1, 0)
    assert 0 < total["p50_ms"] <= total["p99_ms"]
    assert sum(point["requests"] for point in figures["series"]) == total["requests"]
    # A second scrape with no new requests adds nothing; counters are not counted twice.
    metrics_collect()
    assert selectors.endpoint_metrics(endpoint, minutes=10)["total"] == total
    # Samples older than the retention are pruned, the others kept.
    from datetime import timedelta

    from django.utils import timezone

    kept = MetricSample.objects.count()
    old = MetricSample.objects.first()
    MetricSample.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=31))
    assert metrics_prune() == 1
    assert MetricSample.objects.count() == kept - 1
    assert MetricSample.objects.filter(endpoint=endpoint).count() >= 1


def test_what_is_refused(db, owner, team, make_team, make_user, model_version):
    from training.models import ModelVersion

    version = model_version()
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=version)
    with pytest.raises(ValidationError, match="serves traffic on reviews"):
        model_version_delete(actor=owner, version=version)
    assert ModelVersion.objects.filter(pk=version.pk).exists()
    with pytest.raises(ValidationError, match="taken"):
        endpoint_deploy(actor=owner, team=team, model_version=version, name="reviews")
    with pytest.raises(ValidationError, match="lower-case"):
        endpoint_deploy(actor=owner, team=team, model_version=version, name="Bad Name")
    other = make_team("Beta", {make_user("bob"): "owner"})
    with pytest.raises(ValidationError, match="another team"):
        endpoint_deploy(actor=owner, team=other, model_version=version)
    with pytest.raises(ValidationError, match="Unknown device type"):
        revision_add(actor=owner, endpoint=endpoint, model_version=version, device_type="tpu")
    with pytest.raises(ValidationError, match="more than 100"):
        revision_add(actor=owner, endpoint=endpoint, model_version=version, weight=60)
        revision_add(actor=owner, endpoint=endpoint, model_version=version, weight=60)
    # Once the endpoint is gone, the version may be deleted.
    endpoint_delete(actor=owner, endpoint=endpoint)
    model_version_delete(actor=owner, version=version)
    assert not ModelVersion.objects.filter(pk=version.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_worker_converges_after_a_change(
    celery_worker_process, fresh_host, owner, team, model_version
):
    """No manual reconcile: the deploy queues the reconciler on the suite's real worker."""
    from deployment.tasks import reconcile_endpoints

    endpoint = endpoint_deploy(actor=owner, team=team, model_version=model_version())
    deadline = time.monotonic() + 90
    while not Placement.objects.filter(revision__endpoint=endpoint, state="ready").exists():
        assert time.monotonic() < deadline, list(Placement.objects.values("state", "error"))
        time.sleep(2)
        # The first pass started the load; beat comes back every 10 s, this test sooner.
        reconcile_endpoints.delay()
    time.sleep(1)  # the last pass ends before the next test (whose database it cannot see)
    status, body = endpoint_predict(endpoint=endpoint, inputs=["很好"])
    assert status == 200 and body["outputs"][0]["label"] in ("正面", "负面")


def test_a_model_that_fails_to_load_shows_why(db, fresh_host, owner, team, model_version):
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    version = model_version()
    # The stored export is damaged after it was registered.
    name = version.storage_prefix + "export/vocab.txt"
    default_storage.delete(name)
    default_storage.save(name, ContentFile(b"[PAD]\n"))
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=version)
    deadline = time.monotonic() + 60
    while not Placement.objects.filter(state="failed").exists():
        assert time.monotonic() < deadline, list(Placement.objects.values("state", "error"))
        endpoints_reconcile()
        time.sleep(0.3)
    placement = Placement.objects.get()
    assert "vocab.txt does not match its sha256" in placement.error
    failed_at = placement.updated_at
    # Not loaded again at every pass: the failure and its time stay until the retry is due.
    endpoints_reconcile()
    assert Placement.objects.get().updated_at == failed_at
    revisions = list(selectors.endpoint_revisions(endpoint))
    assert selectors.endpoint_state(endpoint, revisions) == "failed"


def test_an_endpoint_of_a_model_named_in_chinese_is_named_in_pinyin(db, owner, team, model_version):
    version = model_version(name="评论模型")
    assert endpoint_deploy(actor=owner, team=team, model_version=version).name == "ping-lun-mo-xing"
    again = endpoint_deploy(actor=owner, team=team, model_version=version)
    assert again.name == "ping-lun-mo-xing-2"
