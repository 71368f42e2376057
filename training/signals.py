"""A model evaluation's files go with it: its items file (each question with the model's answer:
rows of the evaluation set) and the checkpoint of an endpoint run not yet finished. Also when a
deleted model version or dataset takes the evaluation along (a cascade sends ``post_delete``
for each row it deletes): the rows of a deleted set do not live on in storage."""

from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from training.models import ModelEvaluation


@receiver(post_delete, sender=ModelEvaluation)
def _evaluation_files_deleted(sender, instance: ModelEvaluation, **kwargs) -> None:
    names = [instance.items_file, (instance.endpoint or {}).get("checkpoint")]
    names = [name for name in names if name]
    if names:
        transaction.on_commit(lambda: [default_storage.delete(name) for name in names])
