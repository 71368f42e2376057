from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DeploymentConfig(AppConfig):
    name = "deployment"
    verbose_name = _("Deployment")
    console_nav = [("deployment:endpoints", _("Endpoints"))]

    def ready(self) -> None:
        from console.metrics import collectors
        from console.overview import first_steps, panels
        from console.usage import serving_usage
        from deployment.metrics import endpoint_usage, serving_metrics
        from deployment.overview import first_steps as deployment_first_steps
        from deployment.overview import panels as deployment_panels
        from deployment.rollout import refuse_deleting_served_version
        from training.registry import model_version_delete_checks

        model_version_delete_checks.append(refuse_deleting_served_version)
        serving_usage.append(endpoint_usage)
        collectors.append(serving_metrics)
        first_steps.append(deployment_first_steps)
        panels.append(deployment_panels)
