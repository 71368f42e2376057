"""The new-job form guides: each hyperparameter shows the value the job would take, only the
fields of the chosen kind and method show, a change asks the page for a preview (htmx) with
errors beside their fields and nothing queued, and the job's duration is estimated from the
last finished jobs of its model on its device type."""

import json
import re
from datetime import timedelta
from html import unescape

from django.urls import reverse
from django.utils import timezone

from runtime.presets import default_preset
from training.jobs import recommended_values
from training.models import BaseModel, TrainingJob

HTMX = {"HTTP_HX_REQUEST": "true"}


def _field(page: str, name: str) -> str:
    """The wrapper of field ``name`` on the page (its div with label, input, help, errors)."""
    found = re.search(rf'<div( hidden)? data-field="{name}">.*?</div>', page, re.S)
    assert found, name
    return found.group(0)


def _shown(page: str, name: str) -> bool:
    return not _field(page, name).startswith("<div hidden")


def _placeholder(page: str, name: str) -> str | None:
    found = re.search(r'placeholder="([^"]*)"', _field(page, name))
    return found.group(1) if found else None


class Preview:
    """What a preview answers: the plan's text, and the guide the page's script applies."""

    def __init__(self, html: str) -> None:
        self.html = html
        found = re.search(r'data-guide="([^"]*)"', html)
        assert html.strip().startswith('<div id="job-guide"') and found, html
        self.guide = json.loads(unescape(found.group(1)))

    def shown(self, name: str) -> bool:
        return name not in self.guide["hidden"]

    def placeholder(self, name: str) -> str:
        return self.guide["placeholders"][name]

    def errors(self, name: str) -> list[str]:
        return self.guide["errors"].get(name, [])


def _post(client, url: str, version, **fields) -> Preview:
    data = {
        "dataset_version": version.pk,
        "backend": "paddle",
        "model": "preset:",
        "device_type": "cpu",
        "device_count": 1,
        "priority": 5,
        **fields,
    }
    return Preview(client.post(url + "?preview=1", data, **HTMX).content.decode())


def test_the_form_shows_the_recommended_values_and_the_fields_of_the_kind(
    client, owner, team, make_dataset
):
    reviews = make_dataset("text_classification")
    client.force_login(owner)
    url = reverse("training:job_new", kwargs={"team": team.slug})
    page = client.get(url, {"version": reviews.pk}).content.decode()
    # The default on a CPU is the kind's fast model: its values, not the transformer's.
    preset = default_preset("text_classification", "paddle", accelerated=False, devices=1)
    recommended = recommended_values("text_classification", preset)
    assert f"Trains the preset <strong>{preset}</strong>" in page
    assert _placeholder(page, "learning_rate") == f"{recommended['learning_rate']:g}"
    assert _placeholder(page, "epochs") == str(recommended["epochs"])
    assert _placeholder(page, "batch_size") == str(recommended["batch_size"])
    assert not _shown(page, "threshold") and not _shown(page, "dpo_beta")
    assert re.search(r'<details data-testid="llm-hyperparameters" hidden>', page)

    # Another kind chosen: the preview fits the form to it (the threshold of multi-label).
    tags = make_dataset("multi_label")
    preview = _post(client, url, tags)
    assert preview.shown("threshold") and preview.placeholder("threshold") == "0.5"
    # A transformer preset chosen: its own learning rate.
    preview = _post(client, url, reviews, model="preset:ernie-micro-char")
    assert preview.placeholder("learning_rate") == (
        f"{recommended_values('text_classification', 'ernie-micro-char')['learning_rate']:g}"
    )


def test_a_large_models_form_shows_its_method_and_the_fields_of_lora(
    client, owner, team, make_dataset
):
    BaseModel.objects.create(
        team=team,
        name="tiny-chat",
        backend="paddle",
        architecture="llama",
        storage_prefix="b/",
        summary={"causal_lm": True},
    )
    chats = make_dataset("instruction", n=40)
    client.force_login(owner)
    url = reverse("training:job_new", kwargs={"team": team.slug})
    preview = _post(client, url, chats, model="base:tiny-chat")
    assert "Fine-tunes the base model <strong>tiny-chat</strong>" in preview.html
    assert preview.shown("lora_rank") and preview.shown("packing")
    assert not preview.shown("dpo_beta") and not preview.shown("dropout")
    assert preview.placeholder("lora_rank") == "8"
    # Full fine-tuning: no adapters to size.
    assert not _post(client, url, chats, model="base:tiny-chat", method="full").shown("lora_rank")
    # The page itself, opened on the version, shows the section open.
    page = client.get(url, {"version": chats.pk}).content.decode()
    assert re.search(r'<details data-testid="llm-hyperparameters" open>', page)


def test_a_preview_says_what_is_wrong_beside_its_field_and_queues_nothing(
    client, owner, team, make_dataset
):
    reviews = make_dataset("text_classification")
    client.force_login(owner)
    url = reverse("training:job_new", kwargs={"team": team.slug})
    preview = _post(client, url, reviews, batch_size="0", learning_rate="fast")
    assert preview.errors("batch_size") and preview.errors("learning_rate") == ["Enter a number."]
    # Fields left empty are not errors (they take the recommended value).
    assert preview.errors("epochs") == [] and preview.errors("name") == []
    # A choice the plan refuses, beside the model.
    refused = _post(client, url, reviews, model="preset:llama-tiny-char")
    assert "No preset named “llama-tiny-char”" in refused.errors("model")[0]
    assert not TrainingJob.objects.exists()


def test_the_duration_is_estimated_from_the_last_jobs_of_the_model(
    client, owner, team, make_dataset
):
    from training.jobs import training_job_submit

    reviews = make_dataset("text_classification", n=80)
    rows = reviews.split_counts["train"]
    client.force_login(owner)
    url = reverse("training:job_new", kwargs={"team": team.slug})
    page = client.get(url, {"version": reviews.pk}).content.decode()
    assert "No estimate of its duration yet" in page
    # A finished job of the same preset: 10 s to start, then 0.5 s per row and epoch.
    done = training_job_submit(actor=owner, team=team, dataset_version=reviews)
    start = timezone.now() - timedelta(hours=1)
    TrainingJob.objects.filter(pk=done.pk).update(
        status=TrainingJob.Status.SUCCEEDED,
        started_at=start,
        first_step_at=start + timedelta(seconds=10),
        finished_at=start + timedelta(seconds=10 + 0.5 * rows * 2),
        epoch=2,
    )
    epochs = 6
    preview = _post(client, url, reviews, epochs=str(epochs))
    minutes = round((10 + 0.5 * rows * epochs) / 60)
    assert f"About {minutes} minutes for {rows} training rows × {epochs} epochs" in preview.html
    # A time budget caps it.
    assert "About 30 seconds" in _post(client, url, reviews, epochs="6", max_minutes="0.5").html
