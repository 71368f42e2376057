"""Celery tasks of deployment; each calls a service."""

from celery import shared_task

from deployment import evaluations, judge, metrics, preannotate, reconcile
from deployment.hosts import HostError


@shared_task(ignore_result=True)
def reconcile_endpoints() -> dict[str, str]:
    return reconcile.endpoints_reconcile()


@shared_task(ignore_result=True)
def collect_endpoint_metrics() -> int:
    return metrics.metrics_collect()


@shared_task(ignore_result=True)
def prune_endpoint_metrics() -> int:
    return metrics.metrics_prune()


@shared_task(
    ignore_result=True,
    autoretry_for=(HostError,),
    retry_backoff=5,
    retry_kwargs={"max_retries": 5},
)
def preannotate_labeling_project(project_id: int, endpoint_id: int) -> int:
    return preannotate.preannotate_run(project_id, endpoint_id)


@shared_task(ignore_result=True)
def judge_model_evaluation(evaluation_id: int) -> dict:
    return judge.judge_run(evaluation_id)


# Acknowledged late: a worker killed mid-run gives the task back, and the run starts again.
@shared_task(ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def evaluate_endpoint(evaluation_id: int) -> None:
    evaluations.endpoint_evaluation_run(evaluation_id)
