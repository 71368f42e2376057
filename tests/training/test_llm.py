"""Large models through the real Celery train worker and the runner: a tiny LLaMA-architecture
preset fine-tuned with LoRA on instruction data (SFT) and on preference pairs (DPO), on both
backends, evaluated and exported; and what submission refuses."""

import json
import shutil

import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.urls import reverse

from tests.helpers.data import rows_for
from tests.helpers.jobs import wait_for
from training.base_models import base_model_from_version, base_model_import, inspect_model_dir
from training.jobs import training_job_submit
from training.models import ModelVersion

# Every epoch (the history is counted): no early stopping.
FAST = {
    "epochs": 6,
    "batch_size": 8,
    "max_new_tokens": 16,
    "eval_generations": 8,
    "early_stopping_patience": 0,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
@pytest.mark.parametrize("backend", ["paddle", "torch"])
@pytest.mark.parametrize("kind", ["instruction", "preference"])
def test_lora_sft_and_dpo_train_with_each_backend(team, owner, make_dataset, kind, backend):
    version = make_dataset(kind, n=81)
    job = training_job_submit(
        actor=owner, team=team, dataset_version=version, backend=backend, hyperparameters=FAST
    )
    assert job.preset == "llama-tiny-char" and job.labels == []
    assert job.hyperparameters["method"] == "lora"
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    assert job.step == job.total_steps > 0

    model = ModelVersion.objects.get(job=job)
    assert model.runtime == f"{backend}_generate"
    manifest = model.manifest
    assert manifest["objective"] == {"instruction": "sft", "preference": "dpo"}[kind]
    assert manifest["tokenizer"] == {"type": "chat", "file": "tokenizer.json"}
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert f"export/{name}" in model.files
    # The LoRA adapter alone comes with the merged weights.
    assert model.manifest["adapter_dir"] == "adapter"
    adapter = {"paddle": "peft_model.safetensors", "torch": "adapter_model.safetensors"}
    assert f"export/adapter/{adapter[backend]}" in model.files
    config = json.loads(default_storage.open(model.storage_prefix + "export/config.json").read())
    assert config["num_hidden_layers"] == 2  # LoRA merged: a plain model of the architecture

    evaluation = model.evaluation
    history = evaluation["history"]
    assert len(history) == 6 and history[-1]["loss"] < history[0]["loss"]
    metrics = evaluation["metrics"]
    if kind == "instruction":
        assert metrics["perplexity"] < 3, metrics
        assert metrics["rouge_l"] > 0.5, evaluation["generations"]
    else:
        assert metrics["accuracy"] == 1.0 and metrics["margin"] > 0, metrics
    generations = evaluation["generations"]
    assert len(generations) == 8
    assert {"prompt", "reference", "generated", "rouge_l"} <= set(generations[0])
    assert generations[0]["prompt"][-1]["role"] == "user"
    assert evaluation["peak_memory_mb"] > 0


@pytest.mark.django_db
def test_submission_refuses_what_cannot_train(team, owner, make_dataset):
    version = make_dataset("instruction", n=20)
    with pytest.raises(ValidationError, match="No preset named “ernie-micro-char”"):
        training_job_submit(
            actor=owner, team=team, dataset_version=version, preset="ernie-micro-char"
        )
    for bad, rule in (
        ({"method": "qlora"}, "method is lora or full"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"lora_target_modules": "q_proj"}, "must be a list"),
        ({"max_seq_length": 65536}, "max_seq_length"),
        ({"dpo_beta": 0}, "dpo_beta"),
    ):
        with pytest.raises(ValidationError, match=rule):
            training_job_submit(
                actor=owner, team=team, dataset_version=version, hyperparameters=bad
            )
    with pytest.raises(ValidationError, match="one device"):
        training_job_submit(actor=owner, team=team, dataset_version=version, device_count=2)
    classification = make_dataset("text_classification", n=20)
    with pytest.raises(ValidationError, match="No preset named “llama-tiny-char”"):
        training_job_submit(
            actor=owner, team=team, dataset_version=classification, preset="llama-tiny-char"
        )
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        backend="torch",
        hyperparameters={"method": "full", "lora_target_modules": ["q_proj"], "packing": True},
    )
    assert job.hyperparameters["method"] == "full" and job.hyperparameters["packing"] is True


@pytest.mark.django_db
def test_a_causal_lm_is_imported_with_its_size_context_and_memory_estimate(
    client, team, owner, llm_dirs
):
    for backend in ("paddle", "torch"):
        model = base_model_import(
            actor=owner,
            team=team,
            name=f"tiny-{backend}",
            backend=backend,
            path=f"tiny-llama-{backend}",
        )
        summary = model.summary
        assert summary["causal_lm"] and model.architecture == "llama"
        assert summary["context_length"] == 512 and summary["layers"] == 2
        files = set(model.manifest["files"])
        assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= files
        # Weights are stored as safetensors only (a pickled model_state.pdparams converted).
        assert "model.safetensors" in files and not any(f.endswith(".pdparams") for f in files)
    # The count from the config is the weights' own: float32 file ≈ 4 bytes a parameter.
    size = (llm_dirs["torch"] / "model.safetensors").stat().st_size
    assert summary["parameters"] == pytest.approx(size / 4, rel=0.01)
    client.force_login(owner)
    page = client.get(
        reverse("training:base_models", kwargs={"team": team.slug}) + "?batch_size=2"
    ).content.decode()
    assert 'data-testid="memory-estimate"' in page and "batch 2 × 1024" in page
    # What each architecture was tested with here: LLaMA on both backends.
    assert page.count('data-testid="tested-with">tested end to end on this backend') == 2
    assert "<code>qwen2</code> (paddle, torch)" in page


def test_a_causal_lm_without_tokenizer_or_chat_template_is_refused(llm_dirs, tmp_path):
    source = llm_dirs["torch"]
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(source, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(ValidationError, match=r"tokenizer\.json"):
        inspect_model_dir(no_tokenizer, "torch")
    no_template = tmp_path / "no-template"
    shutil.copytree(source, no_template)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValidationError, match="no chat template"):
        inspect_model_dir(no_template, "torch")
    # A template of its own in chat_template.jinja is read instead.
    (no_template / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert inspect_model_dir(no_template, "torch")["causal_lm"]
    odd = tmp_path / "odd"
    shutil.copytree(source, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    with pytest.raises(ValidationError, match="qwen3"):
        inspect_model_dir(odd, "paddle")  # PaddleNLP 3.0.0b4 builds no Qwen3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
@pytest.mark.parametrize("backend", ["paddle", "torch"])
def test_a_job_fine_tunes_an_imported_causal_lm(team, owner, make_dataset, llm_dirs, backend):
    base_model_import(
        actor=owner, team=team, name="tiny", backend=backend, path=f"tiny-llama-{backend}"
    )
    version = make_dataset("instruction", n=81)
    encoder = make_dataset("text_classification", n=20)
    with pytest.raises(ValidationError, match="causal language model"):
        training_job_submit(
            actor=owner, team=team, dataset_version=encoder, backend=backend, base_model="tiny"
        )
    job = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=version,
        backend=backend,
        base_model="tiny",
        hyperparameters={**FAST, "learning_rate": 1e-2, "gradient_accumulation_steps": 2},
    )
    job = wait_for(job)
    assert job.status == "succeeded", job.error
    model = job.model_version
    assert model.base == "tiny" and model.evaluation["metrics"]["rouge_l"] > 0.3
    history = model.evaluation["history"]
    assert history[-1]["loss"] < history[0]["loss"]


def test_the_memory_estimate_of_a_7b_model():
    """Qwen2-7B's config: the figures a team plans cards with."""
    from console.hardware import profile
    from runtime.estimate import causal_lm_summary, fine_tune_memory

    summary = causal_lm_summary(
        {
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
            "vocab_size": 152064,
            "max_position_embeddings": 32768,
        }
    )
    assert summary["parameters"] == pytest.approx(7.6e9, rel=0.02)
    gpu = profile("gpu")

    def gib(**kw):
        return fine_tune_memory(summary, gpu, batch_size=1, seq_length=1024, **kw).total / 2**30

    full, lora = gib(method="full"), gib(method="lora")
    assert 120 < full < 160  # 16 bytes a parameter and activations
    assert 14 < lora < 40  # bfloat16 weights, small adapters
    assert gib(method="lora", recompute=True) < lora


@pytest.mark.django_db
def test_rows_over_the_token_limit_are_counted_at_submission(team, owner, make_dataset, client):
    from labeling.datasets import dataset_create
    from tests.helpers.data import make_jsonl_version

    rows, mapping = rows_for("instruction", 40)
    long_answer = "这是一个很长的回答，" * 10
    rows[3]["messages"][-1]["content"] = long_answer
    rows[7]["messages"][-1]["content"] = long_answer
    dataset = dataset_create(actor=owner, team=team, name="长短", task_kind="instruction")
    version = make_jsonl_version(dataset, owner, rows, mapping)
    job = training_job_submit(
        actor=owner, team=team, dataset_version=version, hyperparameters={"max_seq_length": 64}
    )
    report = job.data_report
    assert report["limit"] == 64 and report["over"] == 2
    assert {o["row"] for o in report["over_rows"]} == {4, 8}
    assert all(o["tokens"] > 100 for o in report["over_rows"])
    assert sum(report["rows"].values()) == 40
    client.force_login(owner)
    page = client.get(
        reverse("training:job", kwargs={"team": team.slug, "training_job_id": job.pk})
    ).content.decode()
    assert 'data-testid="token-report"' in page and "row 4" in page
    with pytest.raises(ValidationError, match="Every training row is over the token limit of 8"):
        training_job_submit(
            actor=owner, team=team, dataset_version=version, hyperparameters={"max_seq_length": 8}
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
def test_dpo_continues_from_the_sft_model(team, owner, make_dataset, client):
    """SFT, then the fine-tuned model as a base model, then DPO from it: the usual chain."""
    sft = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=make_dataset("instruction", n=81),
        hyperparameters=FAST,
    )
    sft = wait_for(sft)
    assert sft.status == "succeeded", sft.error
    client.force_login(owner)
    response = client.post(
        reverse(
            "training:api_model_base_model",
            kwargs={"team": team.slug, "model_version_id": sft.model_version.pk},
        ),
        {"name": "sums-sft"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    base = response.json()
    assert base["summary"]["causal_lm"] and base["architecture"] == "llama"
    assert "tokenizer.json" in base["manifest"]["files"]

    dpo = training_job_submit(
        actor=owner,
        team=team,
        dataset_version=make_dataset("preference", n=81),
        base_model="sums-sft",
        hyperparameters={**FAST, "epochs": 2, "learning_rate": 1e-3},
    )
    dpo = wait_for(dpo)
    assert dpo.status == "succeeded", dpo.error
    metrics = dpo.model_version.evaluation["metrics"]
    assert metrics["accuracy"] >= 0.9, metrics
    # The model learned the form of the answers in SFT, and keeps it after DPO.
    assert metrics["rouge_l"] > 0.5, dpo.model_version.evaluation["generations"]

    classifier = ModelVersion(team=team, name="reviews", task_kind="text_classification")
    with pytest.raises(ValidationError, match="Only large models"):
        base_model_from_version(actor=owner, version=classifier, name="x")
    with pytest.raises(ValidationError, match="exists already"):
        base_model_from_version(actor=owner, version=sft.model_version, name="sums-sft")


@pytest.mark.django_db
def test_qwen2_and_ernie_4_5_import_with_their_layouts_and_chat_templates(team, owner, tmp_path):
    """A tiny Qwen2 (both layouts) and ERNIE 4.5 (transformers' layout), each with its chat
    models' tokenizer files and template (tests/runtime/test_architectures.py), import as base
    models: architecture, size and context from config.json, the template checked and kept and
    rendered as transformers renders it."""

    from runtime.chat import ChatTokenizer
    from tests.helpers.models import chat_model_dir
    from tests.runtime.test_architectures import CHAT, CONVERSATIONS
    from training import storage

    for arch, backend in (("qwen2", "paddle"), ("qwen2", "torch"), ("ernie4_5", "torch")):
        path = f"tiny-{arch}-{backend}"
        target = chat_model_dir(arch, backend)
        model = base_model_import(actor=owner, team=team, name=path, backend=backend, path=path)
        assert model.architecture == arch and model.summary["causal_lm"]
        assert model.summary["layers"] == 2 and model.summary["context_length"] == 512
        stored = tmp_path / path
        storage.fetch_dir(model.storage_prefix, model.manifest["files"], stored)
        tok = ChatTokenizer(stored)
        assert tok.template == CHAT[arch][0]
        expected = json.loads((target / "rendered.json").read_text("utf-8"))
        assert tok.render(CONVERSATIONS[1], False) == expected[3]
