"""A Label Studio server of this test's own, killed (SIGKILL) in the middle of a sync and
started again on the same data directory: nothing that was annotated is lost, nothing is
taken in twice."""

import threading
import time

import pytest

from labeling import label_studio
from labeling.models import Annotation
from labeling.sync import labeling_project_sync
from tests.helpers.data import make_version, reviews_dataset
from tests.helpers.label_studio import (
    choice,
    launcher,
    needs_label_studio,
    push_project,
    task_ids,
)

pytestmark = needs_label_studio


@pytest.fixture
def own_label_studio(tmp_path, settings):
    ls = launcher()
    data_dir, port = tmp_path / "ls", ls.free_port()
    password = ls.admin_password(data_dir)
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "ab")
    # The suite's live server listens on a port chosen as it runs: any port may be the platform's.
    server = {"proc": ls.start(port, data_dir, password, log, webhook_ports="*")}

    def restart():
        server["proc"] = ls.start(port, data_dir, password, log, webhook_ports="*")
        ls.wait_until_up(url, server["proc"])

    try:
        ls.wait_until_up(url, server["proc"])
        settings.LABEL_STUDIO_URL = url
        settings.LABEL_STUDIO_TOKEN = ls.create_token(url, password)
        settings.LABEL_STUDIO_DATA_DIR = data_dir  # where its teams' organisations are made
        label_studio._client.cache_clear()
        yield server, restart
    finally:
        if server["proc"].poll() is None:
            server["proc"].kill()
            server["proc"].wait(timeout=30)
        log.close()
        label_studio._client.cache_clear()


def test_label_studio_killed_mid_sync_and_restarted_loses_nothing(owner, team, own_label_studio):
    server, restart = own_label_studio
    dataset = reviews_dataset(team, owner, "重启")
    rows = [["text", "label"]] + [[f"第{i}条评论，房间干净", ""] for i in range(300)]
    version = make_version(dataset, owner, rows)
    project = push_project(owner, version, "重启")
    ls = label_studio.client(project.team)
    for row, task_id in task_ids(project).items():
        ls.annotations.create(id=task_id, result=choice("正面" if row % 2 else "负面"))

    outcome: dict = {}

    def sync():
        try:
            outcome["counts"] = labeling_project_sync(project.pk)
        except Exception as exc:  # the connection dies under it
            outcome["error"] = exc

    worker = threading.Thread(target=sync)
    worker.start()
    time.sleep(0.5)  # the sync is reading task pages
    server["proc"].kill()
    server["proc"].wait(timeout=30)
    worker.join(timeout=120)
    assert not worker.is_alive()
    # Either the sync finished before the kill, or it failed as a whole and kept nothing.
    if "error" in outcome:
        assert not Annotation.objects.filter(project=project).exists()
    else:
        assert outcome["counts"]["created"] == 300

    restart()
    labeling_project_sync(project.pk)
    annotations = Annotation.objects.filter(project=project)
    assert annotations.count() == 300
    assert annotations.filter(valid=True).count() == 300
    assert set(annotations.values_list("task__row", flat=True)) == set(range(1, 301))
    # Synced again: no duplicates, nothing changed.
    counts = labeling_project_sync(project.pk)
    assert counts == {"created": 0, "updated": 0, "deleted": 0, "invalid": 0}
    assert "error" in outcome, "the kill came too late to test a sync cut off mid-way"
