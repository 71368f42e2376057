"""The task kinds as datasets and Label Studio see them: one class per kind, in a module per
family (``classification``: single and multi-label; ``ner``; ``pairs``: text matching;
``generative``: instruction and preference; ``evaluation``: evaluation sets), each a subclass
of ``base.Kind``, registered here by its ``runtime.kinds.TaskKind``. A new task kind is a member
of ``TaskKind``, its class (fields, row building, label config, Label Studio results) and its
line in ``KINDS``.

Callers ask the registry: ``task_kinds.get(dataset.task_kind).label_config(labels)``.
"""

from labeling.task_kinds.base import Kind
from labeling.task_kinds.classification import MultiLabel, TextClassification
from labeling.task_kinds.evaluation import Evaluation
from labeling.task_kinds.generative import Instruction, Preference
from labeling.task_kinds.ner import Ner
from labeling.task_kinds.pairs import TextPair
from runtime.kinds import TaskKind

KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        TextClassification(),
        MultiLabel(),
        Ner(),
        TextPair(),
        Instruction(),
        Preference(),
        Evaluation(),
    )
}
assert set(KINDS) == set(TaskKind), "every TaskKind has its class"

# The choices of the apps' task_kind fields, in the order of TaskKind, with labels in the
# user's language. Plain strings as values: the migrations hold these.
KIND_CHOICES = [(k.value, KINDS[k].label) for k in TaskKind]


def get(kind: str) -> Kind:
    """The task kind named ``kind`` (a TaskKind or its value); KeyError if there is none."""
    return KINDS[kind]
