from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = _("Training")
    console_nav = [
        ("training:jobs", _("Training")),
        ("training:models", _("Models")),
        ("training:base_models", _("Base models")),
    ]
