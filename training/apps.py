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
        from console.overview import first_steps
        from console.quotas import storage_counters
        from training.metrics import job_metrics
        from training.overview import first_steps as training_first_steps
        from training.selectors import team_base_model_bytes, team_model_version_bytes

        storage_counters["base_models"] = team_base_model_bytes
        storage_counters["model_versions"] = team_model_version_bytes
        collectors.append(job_metrics)
        first_steps.append(training_first_steps)
