"""A project is reachable by the members of its organisation only."""

from projects.mixins import ProjectMixin as LabelStudioProjectMixin


class ProjectMixin(LabelStudioProjectMixin):
    def has_permission(self, user) -> bool:
        user.project = self  # Label Studio's activity log reads it
        if not self.organization_id:
            return False
        # OrganizationMember rows of a removed member are deleted (or soft-deleted by Label
        # Studio's own UI): either way not an active member.
        return self.organization.has_permission(user)
