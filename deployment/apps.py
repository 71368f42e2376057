from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DeploymentConfig(AppConfig):
    name = "deployment"
    verbose_name = _("Deployment")
    console_nav = [("deployment:endpoints", _("Endpoints"))]
