from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class LabelingConfig(AppConfig):
    name = "labeling"
    verbose_name = _("Datasets and labeling")
    console_nav = [("labeling:datasets", _("Datasets")), ("labeling:projects", _("Labeling"))]
    health_checks = ["labeling.label_studio.check_health"]

    def ready(self) -> None:
        from console.metrics import collectors
        from console.overview import first_steps, panels
        from console.quotas import storage_counters, storage_labels
        from labeling import signals  # noqa: F401 - connects the receivers
        from labeling.metrics import labeling_metrics
        from labeling.overview import first_steps as labeling_first_steps
        from labeling.overview import panels as labeling_panels
        from labeling.selectors import team_upload_bytes

        storage_counters["uploads"] = team_upload_bytes
        storage_labels["uploads"] = _("Uploads")
        collectors.append(labeling_metrics)
        first_steps.append(labeling_first_steps)
        panels.append(labeling_panels)
