"""Several jobs' curves overlaid: each job's loss by step (thinned to a bounded number of
points, a later attempt's figure replacing an earlier one's) and each dev metric by epoch;
another team's job is not shown, whatever its id."""

import json
import re

from django.urls import reverse

from console.roles import Role
from labeling.datasets import dataset_create
from tests.helpers.data import version_for
from training.jobs import training_job_submit
from training.models import TrainingEvent
from training.views import CURVE_POINTS


def _job(team, owner, version, name: str, steps: int, f1s: list[float]):
    job = training_job_submit(actor=owner, team=team, dataset_version=version, name=name)
    TrainingEvent.objects.bulk_create(
        [
            *(
                TrainingEvent(job=job, kind="loss", data={"step": s, "loss": 2.0 / s})
                for s in range(1, steps + 1)
            ),
            *(
                TrainingEvent(
                    job=job,
                    kind="metrics",
                    data={"split": "dev", "epoch": e, "metrics": {"macro_f1": f, "accuracy": f}},
                )
                for e, f in enumerate(f1s, start=1)
            ),
            # A second attempt says epoch 1 again: its figure is the one drawn.
            TrainingEvent(
                job=job,
                kind="metrics",
                attempt=2,
                data={"split": "dev", "epoch": 1, "metrics": {"macro_f1": 0.1}},
            ),
        ]
    )
    return job


def test_the_curves_of_several_jobs_are_drawn_together(
    client, owner, team, make_team, make_dataset
):
    version = make_dataset("text_classification")
    short = _job(team, owner, version, "short", 30, [0.5, 0.6])
    long = _job(team, owner, version, "long", 3 * CURVE_POINTS, [0.4, 0.7, 0.8])
    other = make_team("Beta", {owner: Role.OWNER})
    elsewhere = dataset_create(actor=owner, team=other, name="x", task_kind="text_classification")
    theirs = _job(other, owner, version_for(elsewhere, owner), "x", 5, [])
    client.force_login(owner)
    url = reverse("training:jobs_compare", kwargs={"team": team.slug})
    page = client.get(url, {"ids": [short.pk, long.pk, theirs.pk]}).content.decode()
    series = json.loads(
        re.search(
            r'<script id="curves-data" type="application/json">(.*?)</script>', page, re.S
        ).group(1)
    )
    assert [s["name"] for s in series] == ["short", "long"]  # theirs: not found in this team
    assert len(series[0]["loss"]) == 30 and series[0]["loss"][0] == [1, 2.0]
    thinned = series[1]["loss"]
    assert len(thinned) == CURVE_POINTS and thinned[-1] == [
        3 * CURVE_POINTS,
        2.0 / (3 * CURVE_POINTS),
    ]
    assert series[1]["dev"]["macro_f1"] == [[1, 0.1], [2, 0.7], [3, 0.8]]
    assert series[0]["dev"]["accuracy"] == [[1, 0.5], [2, 0.6]]
    assert '<option value="macro_f1" selected>' in page

    # The jobs page ticks jobs into this page.
    jobs = client.get(reverse("training:jobs", kwargs={"team": team.slug})).content.decode()
    assert f'name="ids" value="{short.pk}"' in jobs and 'data-testid="compare-jobs"' in jobs
