"""Roles in a team and what each may do: the one table that console views and the API share.

Later apps add their permissions here, so that one look at ``PERMISSIONS`` answers "who may do
what" for the whole platform.
"""

from enum import StrEnum

from django.db import models
from django.utils.translation import gettext_lazy as _


class Role(models.TextChoices):
    OWNER = "owner", _("Owner")
    MAINTAINER = "maintainer", _("Maintainer")
    ANNOTATOR = "annotator", _("Annotator")
    VIEWER = "viewer", _("Viewer")


class Perm(StrEnum):
    TEAM_VIEW = "team.view"
    TEAM_MANAGE = "team.manage"  # members, roles, team settings
    AUDIT_VIEW = "audit.view"
    DATASET_WRITE = "dataset.write"
    LABELING_MANAGE = "labeling.manage"
    ANNOTATE = "labeling.annotate"
    MODEL_IMPORT = "model.import"
    TRAINING_WRITE = "training.write"
    DEPLOYMENT_WRITE = "deployment.write"


_ALL = frozenset(Role)
_ENGINEERS = frozenset({Role.OWNER, Role.MAINTAINER})

PERMISSIONS: dict[Perm, frozenset[Role]] = {
    Perm.TEAM_VIEW: _ALL,
    Perm.TEAM_MANAGE: frozenset({Role.OWNER}),
    Perm.AUDIT_VIEW: frozenset({Role.OWNER}),
    Perm.DATASET_WRITE: _ENGINEERS,
    Perm.LABELING_MANAGE: _ENGINEERS,
    Perm.ANNOTATE: frozenset({Role.OWNER, Role.MAINTAINER, Role.ANNOTATOR}),
    Perm.MODEL_IMPORT: _ENGINEERS,
    Perm.TRAINING_WRITE: _ENGINEERS,
    Perm.DEPLOYMENT_WRITE: _ENGINEERS,
}


def role_allows(role: str, perm: Perm) -> bool:
    return role in PERMISSIONS[perm]
