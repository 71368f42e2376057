"""LoRA adapters as an insider would attack them: another team's model version served as an
adapter of one's own endpoint (to call a model one may not read), a version of another base
model, an adapter name that is a path; a key limited to one adapter calling another or the
endpoint's model (the same 404 as an adapter that does not exist); an adapter's rate limit
over all keys; a tampered adapter file (refused, the model serves on)."""

import shutil

import openai
import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from deployment.adapters import adapter_add
from deployment.models import EndpointAdapter
from deployment.rollout import endpoint_deploy
from tests.helpers.serving import KEY_HASH, conversation, load, openai_client, route, wait_adapters

QUESTION = conversation("3加4等于几？")


@pytest.mark.django_db
def test_another_teams_version_is_never_an_adapter_of_ones_endpoint(
    client, owner, team, make_user, make_team, model_version, lora_exports
):
    from console.roles import Role

    # The victim's LoRA version of the base model both teams imported under one name.
    victims = model_version("preference", name="secret", export=lora_exports["prefs"], base="tiny")
    mallory = make_user("mallory")
    evil = make_team("Evil", {mallory: Role.OWNER})
    own = model_version("instruction", name="own", export=lora_exports["sums"], base="tiny")
    own.team = evil
    own.save()
    endpoint = endpoint_deploy(actor=mallory, team=evil, model_version=own, name="evil-chat")

    with pytest.raises(ValidationError, match="another team"):
        adapter_add(actor=mallory, endpoint=endpoint, name="x", model_version=victims)
    client.force_login(mallory)
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"  # the reasons are asserted in English
    url = reverse("deployment:api_adapters", kwargs={"team": evil.slug, "endpoint_id": endpoint.pk})
    r = client.post(
        url, {"name": "x", "model_version": victims.pk}, content_type="application/json"
    )
    assert r.status_code == 404  # as a version that does not exist
    # Nor through the console's form: the victim's version is not among its choices.
    page = client.get(
        reverse("deployment:endpoint", kwargs={"team": evil.slug, "endpoint_id": endpoint.pk})
    ).content.decode()
    assert f'<option value="{victims.pk}"' not in page and "secret v1" not in page
    r = client.post(
        reverse("deployment:adapter_add", kwargs={"team": evil.slug, "endpoint_id": endpoint.pk}),
        {"name": "x", "model_version": victims.pk},
    )
    assert r.status_code == 302 and not EndpointAdapter.objects.exists()

    # The team's own versions that do not fit: a preset's (random weights of its own), a name
    # that would be a path.
    preset = model_version("instruction", name="preset")
    preset.team = evil
    preset.save()
    for name, version, why in (
        ("p", preset, "from a preset"),
        ("../x", own, "adapter name"),
    ):
        r = client.post(
            url, {"name": name, "model_version": version.pk}, content_type="application/json"
        )
        assert r.status_code == 400 and why in r.content.decode(), r.content
    assert not EndpointAdapter.objects.exists()


def test_a_key_of_one_adapter_calls_it_alone_and_an_adapter_has_its_own_rate(
    fresh_host, lora_exports
):
    import hashlib

    sums, prefs = lora_exports["sums"], lora_exports["prefs"]
    adapters = {n: {"export_dir": str(prefs)} for n in ("a", "b")}
    assert load(fresh_host, "rev-lora", sums, adapters=adapters)["state"] == "ready"
    assert {s["state"] for s in wait_adapters(fresh_host, "rev-lora").values()} == {"ready"}
    narrow = "mpe_only-adapter-a-0123456789"
    keys = {
        KEY_HASH: {"id": 1, "rate_per_s": None},
        hashlib.sha256(narrow.encode()).hexdigest(): {"id": 2, "adapters": ["a"]},
    }
    route(
        fresh_host,
        "family",
        {"rev-lora": 100},
        keys=keys,
        adapters={"a": {}, "b": {"rate_per_s": 0.01}},
    )
    app = openai_client(fresh_host, narrow)
    app.chat.completions.create(model="family/a", messages=QUESTION, max_tokens=2)
    for model in ("family/b", "family", "family/c"):
        with pytest.raises(openai.NotFoundError) as refused:
            app.chat.completions.create(model=model, messages=QUESTION, max_tokens=2)
        assert "that this key may call" in str(refused.value)

    # "b" takes 0.01 requests per second over every key: the second is 429.
    api = openai_client(fresh_host)
    api.chat.completions.create(model="family/b", messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as limited:
        api.chat.completions.create(model="family/b", messages=QUESTION, max_tokens=2)
    assert int(limited.value.response.headers["Retry-After"]) >= 1
    api.chat.completions.create(model="family/a", messages=QUESTION, max_tokens=2)


def test_an_adapter_file_changed_after_export_is_refused_and_the_model_serves_on(
    fresh_host, lora_exports, tmp_path
):
    sums = lora_exports["sums"]
    forged = tmp_path / "forged"
    shutil.copytree(lora_exports["prefs"], forged)
    weights = forged / "adapter" / "peft_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = b"\x7f" * 8  # the adapter's last weights, made large
    weights.write_bytes(bytes(data))
    rev = load(fresh_host, "rev-lora", sums, adapters={"forged": {"export_dir": str(forged)}})
    assert rev["state"] == "ready"
    state = wait_adapters(fresh_host, "rev-lora")["forged"]
    assert state["state"] == "failed" and "does not match its sha256" in state["error"]
    route(fresh_host, "family", {"rev-lora": 100}, adapters={"forged": {}})
    api = openai_client(fresh_host)
    with pytest.raises(openai.InternalServerError, match="failed"):
        api.chat.completions.create(model="family/forged", messages=QUESTION, max_tokens=2)
    assert api.chat.completions.create(model="family", messages=QUESTION, max_tokens=2).choices
