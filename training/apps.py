from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = _("Training")
    console_nav = [
        ("training:jobs", _("Training")),
        ("training:models", _("Models")),
        ("training:base_models", _("Base models")),
        ("training:evaluation_sets", _("Evaluation sets")),
    ]

    def ready(self) -> None:
        from console.metrics import collectors
        from console.overview import first_steps, panels
        from console.quotas import storage_counters, storage_labels
        from training import signals  # noqa: F401 - connects the receivers
        from training.metrics import job_metrics
        from training.overview import first_steps as training_first_steps
        from training.overview import panels as training_panels
        from training.selectors import team_base_model_bytes, team_model_version_bytes

        storage_counters["base_models"] = team_base_model_bytes
        storage_counters["model_versions"] = team_model_version_bytes
        storage_labels["base_models"] = _("Base models")
        storage_labels["model_versions"] = _("Model versions")
        collectors.append(job_metrics)
        first_steps.append(training_first_steps)
        panels.append(training_panels)
