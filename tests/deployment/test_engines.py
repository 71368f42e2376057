"""Generative revisions on an external engine: the serving host starts the engine's own
OpenAI-compatible server on the export and passes the endpoint's calls to it. vLLM and
FastDeploy do not run on these CPU machines; a stand-in server (fake_engine.py) plays the
engine, so what is tested is the host's side: start, health, proxying, streaming, metrics,
unload, a missing engine."""

import socket

import openai
import pytest

from tests.helpers.serving import conversation, load, openai_client, route


def test_an_engine_revision_serves_through_the_engines_own_server(fresh_host, llm_exports):
    export = llm_exports("instruction")
    state = fresh_host.state()
    assert "fake" in state["engines"] and "vllm" not in state["engines"]
    rev = load(fresh_host, "rev-engine", export, engine="fake")
    assert rev["state"] == "ready", rev["error"]
    assert rev["engine"] == "fake"
    route(fresh_host, "helper", {"rev-engine": 100})
    api = openai_client(fresh_host)
    answer = api.chat.completions.create(model="helper", messages=conversation("你好"))
    assert answer.choices[0].message.content == "引擎答：你好"
    assert answer.model == "helper"  # the endpoint's name, not the engine's
    chunks = list(
        api.chat.completions.create(model="helper", messages=conversation("早"), stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "引擎答：早"
    assert {c.model for c in chunks} == {"helper"}
    with pytest.raises(openai.AuthenticationError):
        openai_client(fresh_host, "mpe_wrong").chat.completions.create(
            model="helper", messages=conversation("你好")
        )
    metrics = fresh_host.manage("GET", "/manage/metrics").json()["endpoints"]["helper"]
    series = metrics["rev-engine"]
    assert series["requests"] == 2 and series["completion_tokens"] == 2 * 6 - 1
    assert sum(series["ttft"]) == 1  # the streamed call

    url = rev["engine_url"]
    fresh_host.manage("DELETE", "/manage/revisions/rev-engine")
    # The engine's server is stopped with the revision.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()


def test_an_engine_the_host_lacks_fails_with_the_reason(fresh_host, llm_exports):
    rev = load(fresh_host, "rev-vllm", llm_exports("instruction"), engine="vllm")
    assert rev["state"] == "failed"
    assert "vllm is not installed on this serving host" in rev["error"]


@pytest.mark.django_db
def test_the_platform_places_an_engine_revision_where_the_engine_serves(owner, team, model_version):
    from django.core.exceptions import ValidationError

    from deployment.reconcile import revision_config
    from deployment.rollout import endpoint_deploy, revision_add

    chat = model_version("instruction", name="helper")
    with pytest.raises(ValidationError, match="vllm serves gpu, not cpu"):
        endpoint_deploy(actor=owner, team=team, model_version=chat, engine="vllm")
    with pytest.raises(ValidationError, match="Unknown engine"):
        endpoint_deploy(actor=owner, team=team, model_version=chat, engine="tgi")
    with pytest.raises(ValidationError, match="Only large models"):
        endpoint_deploy(
            actor=owner,
            team=team,
            model_version=model_version(),
            engine="vllm",
            device_type="gpu",
        )
    endpoint = endpoint_deploy(
        actor=owner, team=team, model_version=chat, engine="fastdeploy", device_type="npu"
    )
    revision = endpoint.revisions.get()
    config = revision_config(revision)
    assert config["engine"] == "fastdeploy" and config["device"] == "npu"
    builtin = revision_add(actor=owner, endpoint=endpoint, model_version=chat)
    assert "engine" not in revision_config(builtin)
