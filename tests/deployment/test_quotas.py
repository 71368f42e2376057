"""A team's endpoint and predictor-replica quotas, set by site staff: a deployment past them is
refused with the use and the quota, and nothing is created."""

import pytest
from django.core.exceptions import ValidationError
from django.utils import translation

from deployment.models import Endpoint, Revision
from deployment.rollout import endpoint_deploy, revision_add


def test_deployments_past_the_teams_endpoint_and_replica_quotas_are_refused(
    team, owner, model_version
):
    team.max_endpoints, team.max_replicas = 1, 2
    team.save()
    version = model_version()
    endpoint = endpoint_deploy(actor=owner, team=team, model_version=version, name="a")
    with translation.override("en"):
        with pytest.raises(ValidationError, match="has 1 endpoints, and its quota is 1"):
            endpoint_deploy(actor=owner, team=team, model_version=version, name="b")
        with pytest.raises(ValidationError, match="run 1 predictor replicas; 2 more would"):
            revision_add(actor=owner, endpoint=endpoint, model_version=version, replicas=2)
    assert Endpoint.objects.filter(team=team).count() == 1
    assert Revision.objects.filter(endpoint=endpoint).count() == 1
    revision_add(actor=owner, endpoint=endpoint, model_version=version, replicas=1)
    team.max_endpoints = team.max_replicas = None  # no limit
    team.save()
    endpoint_deploy(actor=owner, team=team, model_version=version, name="b")
