"""The platform's storage full during an import: the import fails and says so, no half-written
file stays behind, the dataset's earlier versions are intact, and once space is freed the same
upload imports."""

import pytest
from django.core.files.storage import default_storage

from labeling.datasets import dataset_create
from labeling.imports import import_run
from labeling.models import DatasetVersion
from tests.helpers.data import make_version, start_import, upload_data

pytestmark = pytest.mark.django_db


def stored_files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def import_upload(owner, dataset, upload):
    return import_run(start_import(owner, dataset, upload, {"text": "text", "label": "label"}).pk)


def test_an_import_on_a_full_disk_fails_clearly_and_keeps_the_earlier_version(
    owner, team, small_disk, settings
):
    settings.MEDIA_ROOT = str(small_disk.path / "media")
    settings.UPLOAD_STAGING_DIR = small_disk.path / "uploads"
    dataset = dataset_create(actor=owner, team=team, name="评论", task_kind="text_classification")
    first = make_version(dataset, owner)
    first_data = default_storage.open(first.data_file).read()

    data = "text,label\n" + "".join(f"第{i}条评论，质量很好,正面\n" for i in range(3000))
    data = data.encode()
    upload = upload_data(owner, team, data)
    files_before = stored_files(small_disk.path / "media")

    small_disk.fill()
    job = import_upload(owner, dataset, upload)
    assert job.status == "failed"
    assert "No space left on device" in job.error and "import the file again" in job.error
    # Nothing half-written: no version, no new file; the first version reads as before.
    assert list(dataset.versions.values_list("number", flat=True)) == [1]
    assert stored_files(small_disk.path / "media") == files_before
    assert default_storage.open(first.data_file).read() == first_data

    small_disk.free()
    job = import_upload(owner, dataset, upload)
    assert job.status == "succeeded", job.error
    second = DatasetVersion.objects.get(dataset=dataset, number=2)
    assert second.row_count == 3000
