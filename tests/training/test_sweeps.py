"""Hyperparameter search (training.sweeps): the space checked, Optuna's suggestions, the pruning
decision and the end of a sweep on jobs written in the database (the trials' ends written as a
worker would); then one real sweep through the real train worker and runner."""

import time

import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.urls import reverse

from console.models import AuditEvent
from runtime.presets import recommended
from tests.helpers.jobs import wait_for
from training import sweeps
from training.models import ModelVersion, Sweep, TrainingEvent, TrainingJob

SPACE = {
    "learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
    "batch_size": {"choices": [8, 16, 32]},
}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({}, "Tick at least one"),
        ({"seed": {"low": 1, "high": 2}}, "seed cannot be searched"),
        ({"dropout": {"low": 0.3, "high": 0.1}}, "must be below the high end"),
        ({"weight_decay": {"low": 0, "high": 0.1, "log": True}}, "logarithmic range"),
        ({"learning_rate": {"low": 1e-3, "high": 2}}, "0 < learning_rate < 1"),
        ({"batch_size": {"choices": [8, 12.5]}}, "whole numbers"),
        ({"epochs": {"choices": []}}, "1 to 20 choices"),
        ({"warmup_ratio": {"low": "a", "high": 0.2}}, "not a number"),
    ],
)
def test_the_space_is_checked_like_a_jobs_hyperparameters(space, message):
    with pytest.raises(ValidationError, match=message):
        sweeps.checked_space("text_classification", "ngram-bag-char", space)


def test_the_space_is_stored_with_its_types():
    checked = sweeps.checked_space(
        "text_classification",
        "ngram-bag-char",
        {"epochs": {"low": "2", "high": 6.0}, "batch_size": {"choices": ["8", 16, 16]}},
    )
    assert checked == {
        "epochs": {"low": 2, "high": 6, "log": False},
        "batch_size": {"choices": [8, 16]},
    }


def _sweep(owner, team, make_dataset, **kwargs) -> Sweep:
    version = make_dataset(n=80)
    options = {"space": SPACE, "n_trials": 4, "parallel": 2, "seed": 7, **kwargs}
    return sweeps.sweep_create(actor=owner, team=team, dataset_version=version, **options)


def _ended(job: TrainingJob, curve: list[float], status: str = "succeeded", model: bool = True):
    """The trial's end as its worker writes it: dev metrics by epoch, status, model version."""
    for epoch, value in enumerate(curve, start=1):
        TrainingEvent.objects.create(
            job=job,
            kind="metrics",
            data={"step": epoch, "epoch": epoch, "split": "dev", "metrics": {"macro_f1": value}},
        )
    TrainingJob.objects.filter(pk=job.pk).update(status=status)
    if status == "succeeded" and model:
        ModelVersion.objects.create(
            team=job.team,
            name=job.dataset_version.dataset.name,
            number=job.trial_number + 1,
            job=job,
            dataset_version=job.dataset_version,
            task_kind=job.task_kind,
            backend=job.backend,
            runtime="paddle_inference",
            evaluation={"history": [{"epoch": e, "macro_f1": v} for e, v in enumerate(curve)]},
            storage_prefix=f"models/test-{job.pk}/",
        )
    job.refresh_from_db()


@pytest.mark.django_db
def test_a_sweep_queues_its_first_trials_from_the_default_then_in_the_space(
    owner, team, make_dataset
):
    sweep = _sweep(owner, team, make_dataset)
    trials = list(sweep.trials.order_by("trial_number"))
    assert [t.trial_number for t in trials] == [0, 1]
    assert all(t.status == "queued" and t.preset == sweep.preset for t in trials)
    # The first trial is the recommended setting (the fast preset's), the baseline to beat.
    default = recommended("text_classification", preset=sweep.preset)
    assert trials[0].hyperparameters["learning_rate"] == default.learning_rate
    assert trials[0].hyperparameters["batch_size"] == default.batch_size
    for t in trials:
        assert 1e-4 <= t.hyperparameters["learning_rate"] <= 1e-2
        assert t.hyperparameters["batch_size"] in (8, 16, 32)
        assert t.hyperparameters["metric"] == "macro_f1"
    assert trials[1].hyperparameters["learning_rate"] != default.learning_rate

    # A trial ends: the next is queued, with hyperparameters not tried yet.
    _ended(trials[0], [0.5, 0.7, 0.8])
    sweeps.sweep_advance(sweep.pk)
    trials = list(sweep.trials.order_by("trial_number"))
    assert [t.trial_number for t in trials] == [0, 1, 2]
    asked = [(t.hyperparameters["learning_rate"], t.hyperparameters["batch_size"]) for t in trials]
    assert len(set(asked)) == 3


@pytest.mark.django_db
def test_the_best_trial_keeps_its_model_and_the_others_are_deleted(owner, team, make_dataset):
    sweep = _sweep(owner, team, make_dataset, n_trials=3)
    first, second = sweep.trials.order_by("trial_number")
    _ended(first, [0.5, 0.7, 0.75])
    _ended(second, [0.6, 0.9, 0.85])
    sweeps.sweep_advance(sweep.pk)
    third = sweep.trials.get(trial_number=2)
    _ended(third, [0.1], status="failed")
    sweep = sweeps.sweep_advance(sweep.pk)
    assert sweep.status == "succeeded" and sweep.finished_at
    assert sweep.best_job == second
    assert sweep.best_model_version == ModelVersion.objects.get(job=second)
    assert list(ModelVersion.objects.filter(team=team)) == [sweep.best_model_version]
    rows = sweeps.sweep_trials(sweep)
    assert [r["best"] for r in rows] == [False, True, False]
    assert rows[1]["value"] == 0.9 and rows[0]["value"] == 0.75
    # Two finished trials: how much each hyperparameter mattered.
    importances = sweeps.param_importances(sweep, list(sweep.trials.all()))
    assert set(importances) == set(SPACE)


@pytest.mark.django_db
def test_a_trial_below_the_median_is_pruned_by_the_cancel_path(owner, team, make_dataset):
    sweep = _sweep(owner, team, make_dataset, n_trials=5)
    first, second = sweep.trials.order_by("trial_number")
    _ended(first, [0.5, 0.7, 0.8])
    sweeps.sweep_advance(sweep.pk)
    _ended(second, [0.55, 0.75, 0.85])
    sweeps.sweep_advance(sweep.pk)
    running, doing_well = sweep.trials.filter(trial_number__in=(2, 3)).order_by("trial_number")
    TrainingJob.objects.filter(pk__in=(running.pk, doing_well.pk)).update(status="running")
    # The first epoch is not judged (warm-up).
    _ended(running, [0.2], status="running")
    assert not sweeps.sweep_trial_reported(running.pk)
    TrainingEvent.objects.create(
        job=running,
        kind="metrics",
        data={"epoch": 2, "split": "dev", "metrics": {"macro_f1": 0.3}},
    )
    _ended(doing_well, [0.6, 0.8], status="running")
    assert not sweeps.sweep_trial_reported(doing_well.pk)
    assert sweeps.sweep_trial_reported(running.pk)
    running.refresh_from_db()
    assert running.pruned and running.cancel_requested and running.status == "running"
    assert (
        "pruned by the hyperparameter search"
        in running.events.filter(kind="log").last().data["message"]
    )
    # Its worker stops it and ends it cancelled: a pruned trial of the study.
    TrainingJob.objects.filter(pk=running.pk).update(status="cancelled")
    sweeps.sweep_advance(sweep.pk)
    states = {
        t.number: t.state.name
        for t in sweeps.build_study(sweep, list(sweep.trials.all())).get_trials()
    }
    assert states[running.trial_number] == "PRUNED"
    assert sweep.trials.count() == 5


@pytest.mark.django_db
def test_a_sweep_is_refused_without_a_dev_split_or_beyond_the_users_limit(
    owner, team, make_dataset, settings
):
    version = make_dataset(n=80)
    with pytest.raises(ValidationError, match="Trials in parallel"):
        sweeps.sweep_create(
            actor=owner, team=team, dataset_version=version, space=SPACE, n_trials=3, parallel=4
        )
    settings.TRAINING_MAX_CONCURRENT_PER_USER = 1
    with pytest.raises(ValidationError, match="Trials in parallel"):
        sweeps.sweep_create(
            actor=owner, team=team, dataset_version=version, space=SPACE, n_trials=3, parallel=2
        )
    assert not Sweep.objects.exists() and not TrainingJob.objects.exists()


@pytest.mark.django_db
def test_cancel_stops_the_trials_and_keeps_the_best_so_far(owner, team, make_dataset):
    sweep = _sweep(owner, team, make_dataset)
    first, second = sweep.trials.order_by("trial_number")
    _ended(first, [0.5, 0.6])
    sweep = sweeps.sweep_cancel(actor=owner, sweep=sweep)
    second.refresh_from_db()
    assert sweep.status == "cancelled" and second.status == "cancelled"
    assert sweep.best_job == first
    with pytest.raises(ValidationError, match="nothing to cancel"):
        sweeps.sweep_cancel(actor=owner, sweep=sweep)


# -- The API and the pages ---------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_creates_shows_and_cancels_a_sweep(client, owner, team, make_dataset):
    from console.services import api_token_create

    _token, key = api_token_create(actor=owner, name="ci")
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    version = make_dataset(n=80)
    base = f"/api/v1/teams/{team.slug}/sweeps/"
    body = {
        "dataset_id": version.dataset_id,
        "dataset_version": version.number,
        "space": SPACE,
        "n_trials": 3,
        "parallel": 2,
    }
    refused = client.post(
        base, {**body, "space": {"seed": {"low": 1, "high": 2}}}, content_type="application/json"
    )
    assert refused.status_code == 400 and "seed cannot be searched" in refused.content.decode()
    made = client.post(base, body, content_type="application/json")
    assert made.status_code == 201, made.content
    sweep = made.json()
    assert sweep["status"] == "running" and sweep["space"]["batch_size"] == {"choices": [8, 16, 32]}
    assert [t["number"] for t in sweep["trials"]] == [0, 1] and sweep["importances"] == {}
    assert client.get(base).json()["results"][0]["id"] == sweep["id"]
    shown = client.get(f"{base}{sweep['id']}/").json()
    default = recommended("text_classification", preset=shown["preset"])
    assert shown["trials"][0]["params"] == {
        "learning_rate": default.learning_rate,
        "batch_size": default.batch_size,
    }
    cancelled = client.post(f"{base}{sweep['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert {t["status"] for t in cancelled.json()["trials"]} == {"cancelled"}


@pytest.mark.django_db
def test_the_sweep_pages_tick_ranges_and_show_every_trial(client, owner, team, make_dataset):
    version = make_dataset(n=80)
    client.force_login(owner)
    jobs_page = client.get(reverse("training:jobs", args=[team.slug])).content.decode()
    assert reverse("training:sweeps", args=[team.slug]) in jobs_page
    new = reverse("training:sweep_new", args=[team.slug])
    assert 'data-testid="search-learning_rate"' in client.get(new).content.decode()
    form = {
        "dataset_version": version.pk,
        "backend": "paddle",
        "model": "preset:",
        "device_type": "cpu",
        "n_trials": 3,
        "parallel": 1,
        "metric": "macro_f1",
        "name": "lr search",
    }
    nothing_ticked = client.post(new, form).content.decode()
    assert "Tick at least one hyperparameter" in nothing_ticked
    form |= {
        "search_learning_rate": "on",
        "learning_rate_low": "0.0001",
        "learning_rate_high": "0.01",
        "learning_rate_log": "on",
        "search_batch_size": "on",
        "batch_size_choices": "16, 32",
    }
    response = client.post(new, form)
    sweep = Sweep.objects.get(name="lr search")
    assert response.url == reverse("training:sweep", args=[team.slug, sweep.pk])
    assert sweep.space == {
        "learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
        "batch_size": {"choices": [16, 32]},
    }
    first = sweep.trials.get()
    _ended(first, [0.5, 0.8])
    sweeps.sweep_advance(sweep.pk)
    second = sweep.trials.get(trial_number=1)
    _ended(second, [0.4, 0.6])
    sweeps.sweep_advance(sweep.pk)
    page = client.get(response.url).content.decode()
    assert 'data-testid="trial-0"' in page and 'data-testid="trial-2"' in page
    assert 'data-testid="importances"' in page and 'data-testid="importance-learning_rate"' in page
    listed = client.get(reverse("training:sweeps", args=[team.slug])).content.decode()
    assert "lr search" in listed


# -- One real sweep ----------------------------------------------------------------------------


def _stored_files(path: str = "models") -> set[str]:
    """Every file under ``path`` in the platform's storage."""
    if not default_storage.exists(path):
        return set()
    dirs, files = default_storage.listdir(path)
    found = {f"{path}/{name}" for name in files}
    for name in dirs:
        found |= _stored_files(f"{path}/{name}")
    return found


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("train_worker")
def test_a_sweep_through_the_train_worker_registers_its_best_model_only(owner, team, make_dataset):
    version = make_dataset(n=120)
    # Six epochs of the small transformer: its default learning rate (the first trial) is too
    # small for so few, and the search looks above it. (A fast preset would not do: its wide
    # part is solved before the first step, whatever the rate.)
    default = recommended("text_classification", preset="ernie-micro-char").learning_rate
    sweep = sweeps.sweep_create(
        actor=owner,
        team=team,
        dataset_version=version,
        preset="ernie-micro-char",
        space={"learning_rate": {"low": default, "high": 5 * default, "log": True}},
        hyperparameters={
            "epochs": 6,
            "batch_size": 16,
            "max_seq_length": 32,
            "early_stopping_patience": 0,
        },
        n_trials=3,
        parallel=2,
    )
    stored_before = _stored_files()
    sweep = wait_for(sweep, timeout=240)
    assert sweep.status == "succeeded", sweep.error
    trials = list(sweep.trials.order_by("trial_number"))
    # Every trial ran; the last, judged against the first two, may have been pruned.
    assert len(trials) == 3 and trials[0].status == trials[1].status == "succeeded"
    assert trials[2].status == "succeeded" or (trials[2].status == "cancelled" and trials[2].pruned)
    assert all(t.events.filter(kind="metrics").exists() for t in trials)
    succeeded = [t for t in trials if t.status == "succeeded"]
    # Only the best trial's model is registered; the others' files are gone.
    best = ModelVersion.objects.get(team=team)
    assert sweep.best_model_version == best and sweep.best_job == best.job
    kept = {best.storage_prefix + name for name in best.files}
    deadline = time.monotonic() + 10  # the files go once the end is committed
    while _stored_files() - stored_before != kept:
        assert time.monotonic() < deadline, _stored_files() - stored_before - kept
        time.sleep(0.2)
    deleted = AuditEvent.objects.filter(action="model.delete", team=team).count()
    assert deleted == len(succeeded) - 1
    values = {t.trial_number: sweeps.trial_value(t, "macro_f1") for t in succeeded}
    assert values[best.job.trial_number] == max(values.values())
    # The default (trial 0) is the baseline: the search found a better model.
    assert trials[0].hyperparameters["learning_rate"] == default
    assert values[best.job.trial_number] > values[0], values
    assert best.job.trial_number != 0 and best.job.hyperparameters["learning_rate"] > default
