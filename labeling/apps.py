from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class LabelingConfig(AppConfig):
    name = "labeling"
    verbose_name = _("Datasets and labeling")
    console_nav = [("labeling:datasets", _("Datasets")), ("labeling:projects", _("Labeling"))]
    health_checks = ["labeling.label_studio.check_health"]
