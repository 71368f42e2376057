"""Many LoRA adapters over one served model on the serving host (``serving/generative.py``):
two LoRA versions of one imported base, the second served as an adapter of the first and
called by name through the ``openai`` client, each answering as its own merged export does,
in one batch; adapters added and removed without loading the model again; metrics per adapter.
"""

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.helpers.serving import (
    bare_generate,
    conversation,
    load,
    openai_client,
    route,
    wait_adapters,
)

QUESTIONS = ["3加4等于几？", "5加6等于几？"]


def _ask(api, model: str, question: str) -> str:
    answer = api.chat.completions.create(
        model=model, messages=conversation(question), max_tokens=8, temperature=0
    )
    assert answer.model == model
    return answer.choices[0].message.content


def test_adapters_are_called_by_name_and_change_without_a_reload(fresh_host, lora_exports):
    sums, prefs = lora_exports["sums"], lora_exports["prefs"]
    adapters = {"prefs": {"export_dir": str(prefs)}}
    rev = load(fresh_host, "rev-lora", sums, adapters=adapters)
    assert rev["state"] == "ready", rev["error"]
    assert wait_adapters(fresh_host, "rev-lora")["prefs"]["state"] == "ready"
    route(fresh_host, "family", {"rev-lora": 100}, adapters={"prefs": {}})
    api = openai_client(fresh_host)

    # Each model as its own merged export answers, alone and side by side in one batch.
    expected = {
        "family": bare_generate(
            sums, [conversation(q) for q in QUESTIONS], max_tokens=8, temperature=0
        ),
        "family/prefs": bare_generate(
            prefs, [conversation(q) for q in QUESTIONS], max_tokens=8, temperature=0
        ),
    }
    assert expected["family"] != expected["family/prefs"]  # the adapter tells them apart
    calls = [(model, i) for model in expected for i in range(len(QUESTIONS))] * 2
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda c: _ask(api, c[0], QUESTIONS[c[1]]), calls))
    assert answers == [expected[model][i] for model, i in calls]

    with pytest.raises(openai.NotFoundError, match="not a model"):
        _ask(api, "family/nobody", QUESTIONS[0])

    # Another adapter is added in place (the first version's own adapter, as "again": over
    # the model it was merged into, it answers as that model does); the model is not loaded
    # again, and its processes go on.
    before = fresh_host.state()["revisions"]["rev-lora"]
    both = {**adapters, "again": {"export_dir": str(sums)}}
    r = fresh_host.manage(
        "PUT", "/manage/revisions/rev-lora", {"export_dir": str(sums), "adapters": both}
    )
    assert r.status_code == 200, r.text
    assert wait_adapters(fresh_host, "rev-lora")["again"]["state"] == "ready"
    route(fresh_host, "family", {"rev-lora": 100}, adapters={"prefs": {}, "again": {}})
    after = fresh_host.state()["revisions"]["rev-lora"]
    assert after["load_s"] == before["load_s"] and after["batches"] >= before["batches"]
    assert _ask(api, "family/again", QUESTIONS[0]) == expected["family"][0]
    assert _ask(api, "family/prefs", QUESTIONS[0]) == expected["family/prefs"][0]

    # Removed from the revision, still routed: the host says it is not loaded there.
    r = fresh_host.manage(
        "PUT",
        "/manage/revisions/rev-lora",
        {"export_dir": str(sums), "adapters": {"again": both["again"]}},
    )
    assert r.status_code == 200
    wait_adapters(fresh_host, "rev-lora")
    with pytest.raises(openai.InternalServerError, match="not loaded"):
        _ask(api, "family/prefs", QUESTIONS[0])
    assert fresh_host.state()["revisions"]["rev-lora"]["load_s"] == before["load_s"]

    # Metrics per adapter: "<endpoint>/<adapter>" beside the endpoint's own.
    metrics = fresh_host.manage("GET", "/manage/metrics").json()["endpoints"]
    assert metrics["family/prefs"]["rev-lora"]["requests"] >= 5
    assert metrics["family/again"]["rev-lora"]["requests"] == 1
    assert metrics["family"]["rev-lora"]["requests"] == len(QUESTIONS) * 2


def test_an_adapter_that_does_not_fit_fails_with_its_reason(fresh_host, lora_exports, llm_exports):
    """A version with no adapter (the preset's merged model) and a file changed after export
    each fail on their own; the model and the other adapters serve."""
    sums, prefs = lora_exports["sums"], lora_exports["prefs"]
    full = llm_exports("instruction", "torch")  # a torch model's adapter on a paddle model
    adapters = {
        "prefs": {"export_dir": str(prefs)},
        "torch": {"export_dir": str(full)},
        "tampered": {"export_dir": str(prefs), "manifest_sha256": "0" * 64},
    }
    rev = load(fresh_host, "rev-lora", sums, adapters=adapters)
    assert rev["state"] == "ready", rev["error"]
    states = wait_adapters(fresh_host, "rev-lora")
    assert states["prefs"]["state"] == "ready"
    assert states["torch"]["state"] == "failed" and "torch_generate" in states["torch"]["error"]
    assert states["tampered"]["state"] == "failed"
    assert "not the manifest the platform holds" in states["tampered"]["error"]


@pytest.mark.django_db
def test_a_team_serves_two_lora_versions_from_one_revision(
    fresh_host, owner, team, model_version, lora_exports, client
):
    """Through the platform: the "sums" version deployed, the "prefs" version added as its
    adapter by the API, loaded by the reconciler without a reload, called by name with a key
    that may call only it, shown on the endpoint page with its state and its metrics, and
    removed."""
    import time

    from django.urls import reverse

    from deployment import selectors
    from deployment.keys import endpoint_key_create
    from deployment.metrics import metrics_collect
    from deployment.models import Placement
    from deployment.reconcile import endpoints_reconcile
    from deployment.rollout import endpoint_deploy
    from tests.helpers.serving import converge

    sums = model_version("instruction", name="sums", export=lora_exports["sums"], base="tiny")
    prefs = model_version("preference", name="prefs", export=lora_exports["prefs"], base="tiny")
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=sums, name="family")
    converge(fresh_host, endpoint)
    loaded_in = fresh_host.state()["revisions"][f"rev-{endpoint.stable_revision_id}"]["load_s"]

    client.force_login(owner)
    api_url = reverse(
        "deployment:api_adapters", kwargs={"team": team.slug, "endpoint_id": endpoint.pk}
    )
    r = client.post(
        api_url, {"name": "prefs", "model_version": prefs.pk}, content_type="application/json"
    )
    assert r.status_code == 201, r.content
    assert r.json()["model"] == "family/prefs"
    deadline = time.monotonic() + 60
    while True:
        endpoints_reconcile()
        placed = Placement.objects.get(revision=endpoint.stable_revision)
        if placed.adapters.get("prefs", {}).get("state") == "ready":
            break
        assert time.monotonic() < deadline, placed.adapters
        time.sleep(0.3)
    revision = fresh_host.state()["revisions"][f"rev-{endpoint.stable_revision_id}"]
    assert revision["load_s"] == loaded_in  # the model was not loaded again

    _key, plain = endpoint_key_create(
        actor=owner, endpoint=endpoint, name="prefs-app", adapters=["prefs"]
    )
    endpoints_reconcile()
    app = openai_client(fresh_host, plain)
    question = conversation(QUESTIONS[0])
    answer = app.chat.completions.create(
        model="family/prefs", messages=question, max_tokens=8, temperature=0
    )
    expected = bare_generate(lora_exports["prefs"], [question], max_tokens=8, temperature=0)
    assert answer.choices[0].message.content == expected[0]
    with pytest.raises(openai.NotFoundError):  # this key may call only its adapter
        app.chat.completions.create(model="family", messages=question, max_tokens=4)

    page = client.get(
        reverse("deployment:endpoint", kwargs={"team": team.slug, "endpoint_id": endpoint.pk})
    ).content.decode()
    assert 'data-adapter="prefs"' in page and "family/prefs" in page
    assert 'data-testid="adapter-state" data-state="ready"' in page
    assert 'data-testid="adapter-form"' not in page  # no other LoRA version of this base fits
    metrics_collect()
    figures = selectors.endpoint_metrics(endpoint)
    assert figures["adapters"]["prefs"]["requests"] == 1
    assert figures["adapters"]["prefs"]["completion_tokens"] == answer.usage.completion_tokens

    listed = client.get(api_url).json()["results"]
    assert [a["name"] for a in listed] == ["prefs"]
    assert listed[0]["state"][fresh_host.url]["state"] == "ready"
    r = client.delete(f"{api_url}{listed[0]['id']}/")
    assert r.status_code == 204
    endpoints_reconcile()
    with pytest.raises(openai.NotFoundError):
        app.chat.completions.create(model="family/prefs", messages=question, max_tokens=4)
