"""Label Studio's community edition trusts every account with its own organisation; the platform
runs one organisation per team, so these guards hold what LS 1.23.2 leaves open:

- A user's ``active_organization`` is one where they are an active member: a ``pre_save`` guard
  on the user (LS's own ``PATCH /api/users/<id>`` wrote any id there, and most of LS's routes
  scope by it alone), and LS's user serializers have the field read-only. ``for_user`` of
  projects, tasks and annotations also asks for the membership.
- ``POST /api/tasks/`` and ``/api/predictions/`` (and a prediction's update) write only into a
  project the requester may reach (LS looked the project or task up by id and wrote).
- Webhooks are the organisation owner's (the platform's service account): a member neither
  lists (their secret header!), changes nor deletes them.
- An annotation is the requester's own: an account other than the organisation's owner (the
  platform's service account) cannot create one with another ``completed_by``, nor change or
  delete a colleague's (one member would otherwise vote in a colleague's name).
"""

from django.db.models.signals import pre_save
from rest_framework.exceptions import PermissionDenied


def _member_orgs(user):
    from organizations.models import OrganizationMember

    return OrganizationMember.objects.filter(user_id=user.pk, deleted_at__isnull=True).values(
        "organization_id"
    )


def keep_active_organization_a_membership(sender, instance, update_fields=None, **kwargs) -> None:
    """Before a user is saved: an active organisation they are no active member of is replaced
    by their first active membership's (or none)."""
    from organizations.models import OrganizationMember

    org_id = instance.active_organization_id
    if org_id is None or (update_fields is not None and "active_organization" not in update_fields):
        return
    if instance.pk is not None:
        mine = OrganizationMember.objects.filter(user_id=instance.pk, deleted_at__isnull=True)
        if mine.filter(organization_id=org_id).exists():
            return
        first = mine.order_by("pk").first()
        instance.active_organization_id = first.organization_id if first else None
    else:
        instance.active_organization_id = None


def _require_project(project, user) -> None:
    if project is None or not project.has_permission(user):
        raise PermissionDenied("You have no permission to this project.")


def _is_owner(project, user) -> bool:
    return project.organization.created_by_id == user.pk


def _owner_only(get_queryset):
    def owner_only(self):
        queryset = get_queryset(self)
        org = self.request.user.active_organization
        if org is None or org.created_by_id != self.request.user.pk:
            return queryset.none()
        return queryset

    return owner_only


def install() -> None:
    import projects.models
    import tasks.api
    import tasks.models
    import users.serializers
    from projects.models import Project
    from users.models import User

    # A PATCH naming it is answered 405 by UserAPI (it checks the read-only fields).
    users.serializers.BaseUserSerializer.Meta.read_only_fields = ("active_organization",)
    users.serializers.BaseUserSerializerUpdate.Meta.read_only_fields = (
        "email",
        "active_organization",
    )

    pre_save.connect(
        keep_active_organization_a_membership,
        sender=User,
        dispatch_uid="platform_ls.active_organization",
    )

    # for_user: the active organisation, and only while a member of it.
    def projects_for_user(self, user):
        return self.get_queryset().filter(
            organization=user.active_organization, organization_id__in=_member_orgs(user)
        )

    def project_scoped_for_user(self, user):
        return self.get_queryset().filter(
            project__organization=user.active_organization,
            project__organization_id__in=_member_orgs(user),
        )

    projects.models.ProjectManager.for_user = projects_for_user
    tasks.models.TaskManager.for_user = project_scoped_for_user
    tasks.models.AnnotationManager.for_user = project_scoped_for_user

    # POST /api/tasks/ {"project": <any id>}
    task_create = tasks.api.TaskListAPI.perform_create

    def perform_task_create(self, serializer):
        project_id = self.request.data.get("project")
        project = (
            Project.objects.filter(pk=project_id).first() if str(project_id).isdigit() else None
        )
        _require_project(project, self.request.user)
        return task_create(self, serializer)

    tasks.api.TaskListAPI.perform_create = perform_task_create

    # POST /api/predictions/ {"task": <any id>} and PATCH moving a prediction elsewhere.
    def _check_prediction(self, serializer) -> None:
        data = serializer.validated_data
        if "task" in data:
            _require_project(data["task"].project, self.request.user)
        if data.get("project") is not None:
            _require_project(data["project"], self.request.user)
        if serializer.instance is not None:
            _require_project(serializer.instance.project, self.request.user)
        if "task" not in data and data.get("project") is None and serializer.instance is None:
            raise PermissionDenied("A prediction needs a task of a project you may reach.")

    prediction_create = tasks.api.PredictionAPI.perform_create
    prediction_update = tasks.api.PredictionAPI.perform_update

    def perform_prediction_create(self, serializer):
        _check_prediction(self, serializer)
        return prediction_create(self, serializer)

    def perform_prediction_update(self, serializer):
        _check_prediction(self, serializer)
        return prediction_update(self, serializer)

    tasks.api.PredictionAPI.perform_create = perform_prediction_create
    tasks.api.PredictionAPI.perform_update = perform_prediction_update

    # Annotations: in one's own name only.
    annotation_create = tasks.api.AnnotationsListAPI.perform_create
    annotation_update = tasks.api.AnnotationAPI.perform_update
    annotation_api_update_ls = tasks.api.AnnotationAPI.update
    annotation_destroy = tasks.api.AnnotationAPI.perform_destroy

    def perform_annotation_create(self, ser):
        user = self.request.user
        author = ser.validated_data.get("completed_by")
        if author is not None and author.pk != user.pk:
            if not _is_owner(self.parent_object.project, user):
                raise PermissionDenied("An annotation is made in your own name only.")
        return annotation_create(self, ser)

    def annotation_api_update(self, request, *args, **kwargs):
        # Checked before LS's update, which writes ``updated_by`` before it saves.
        annotation = self.get_object()
        if annotation.completed_by_id != request.user.pk and not _is_owner(
            annotation.project, request.user
        ):
            raise PermissionDenied("You may change your own annotations only.")
        return annotation_api_update_ls(self, request, *args, **kwargs)

    def perform_annotation_update(self, ser):
        user = self.request.user
        author = ser.validated_data.get("completed_by")
        if (
            author is not None
            and author.pk != user.pk
            and not _is_owner(ser.instance.project, user)
        ):
            raise PermissionDenied("An annotation is made in your own name only.")
        return annotation_update(self, ser)

    def perform_annotation_destroy(self, annotation):
        user = self.request.user
        if annotation.completed_by_id != user.pk and not _is_owner(annotation.project, user):
            raise PermissionDenied("You may delete your own annotations only.")
        return annotation_destroy(self, annotation)

    tasks.api.AnnotationsListAPI.perform_create = perform_annotation_create

    # Webhooks: the owner's only.
    import webhooks.api

    for view in (webhooks.api.WebhookListAPI, webhooks.api.WebhookAPI):
        view.get_queryset = _owner_only(view.get_queryset)
    tasks.api.AnnotationAPI.update = annotation_api_update
    tasks.api.AnnotationAPI.perform_update = perform_annotation_update
    tasks.api.AnnotationAPI.perform_destroy = perform_annotation_destroy
