import logging

import httpx
from celery import shared_task
from label_studio_sdk.core.api_error import ApiError

from labeling.datasets import uploads_expire
from labeling.imports import import_run
from labeling.label_studio import NotConfigured
from labeling.projects import (
    PUSH_BACKOFF_MAX_S,
    PUSH_BACKOFF_S,
    PUSH_RETRIES,
    labeling_project_problem,
    labeling_project_push,
    labeling_projects_push_again,
)
from labeling.selectors import labeling_projects_to_reconcile
from labeling.sync import (
    label_studio_account_update,
    label_studio_members_converge,
    labeling_project_sync,
)

logger = logging.getLogger(__name__)


@shared_task
def run_import_job(job_id: int) -> None:
    """Import a file (or merge versions) into a new dataset version.

    Acknowledged late: a worker killed mid-import leaves the task queued, and the next worker
    runs the import again from the start (it writes nothing visible until it is done)."""
    import_run(job_id)


@shared_task(
    bind=True,
    autoretry_for=(httpx.HTTPError, ApiError),
    retry_backoff=PUSH_BACKOFF_S,
    retry_backoff_max=PUSH_BACKOFF_MAX_S,
    max_retries=PUSH_RETRIES,
)
def push_labeling_project(self, project_id: int) -> None:
    """Make a labeling project's Label Studio project and push its tasks. While Label Studio is
    down it retries with backoff (about 35 minutes in all), and says so on the project."""
    try:
        labeling_project_push(project_id)
    except (httpx.HTTPError, ApiError) as exc:
        last = self.request.retries >= self.max_retries
        labeling_project_problem(project_id, f"Label Studio: {exc}", final=last)
        raise
    except NotConfigured as exc:
        labeling_project_problem(project_id, str(exc), final=True)
        raise


@shared_task(
    autoretry_for=(httpx.HTTPError, ApiError),
    retry_backoff=5,
    retry_backoff_max=300,
    max_retries=12,
)
def sync_labeling_project(project_id: int) -> None:
    """Take in a project's annotations (asked for by a webhook or the reconciliation)."""
    labeling_project_sync(project_id)


@shared_task
def update_label_studio_account(user_id: int) -> None:
    """A membership or the user changed: their Label Studio account follows at once."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(pk=user_id).first()
    if user is not None:
        label_studio_account_update(user)


@shared_task
def reconcile_labeling_projects() -> None:
    """Scheduled by beat: Label Studio's organisations and accounts brought in line with the
    teams' memberships (removed and deactivated members lose their access here at the latest),
    then every ready project synced, so a missed webhook loses nothing, and the projects whose
    push gave up while Label Studio was down pushed again."""
    from django.conf import settings

    if settings.LABEL_STUDIO_URL:
        try:
            label_studio_members_converge()
        except Exception:  # Label Studio away: the next run converges; the syncs still filter
            logger.exception("Label Studio accounts not reconciled")
    for project_id in labeling_projects_to_reconcile():
        sync_labeling_project.delay(project_id)
    for project_id in labeling_projects_push_again():
        push_labeling_project.delay(project_id)


@shared_task
def expire_uploads() -> int:
    """Scheduled by beat: uploads abandoned (never completed, or never imported) for
    UPLOAD_EXPIRY_HOURS are deleted, files and rows."""
    return uploads_expire()
