"""The task kinds of the platform: the one definition that the runtime, the serving host and the
apps share. No Django here: the apps build their model fields' choices from it, with labels in
the user's language (``labeling.task_kinds.KIND_CHOICES``).

A member is a ``str``: it equals, and hashes as, its value, so a kind read from a spec, a
manifest or a database row is found in a dict or set keyed by members.
"""

from enum import Enum

try:
    from enum import StrEnum
except ImportError:  # Python 3.10, where a Paddle Lite edge bundle runs this module

    class StrEnum(str, Enum):  # type: ignore[no-redef]  # noqa: UP042  # 3.11's, for 3.10
        def __str__(self) -> str:
            return str(self.value)


class TaskKind(StrEnum):
    TEXT_CLASSIFICATION = "text_classification"
    MULTI_LABEL = "multi_label"
    NER = "ner"
    TEXT_PAIR = "text_pair"
    INSTRUCTION = "instruction"
    PREFERENCE = "preference"
    # Questions a causal LM is scored on (runtime.llm_eval), never trained on.
    EVALUATION = "evaluation"


# Kinds whose model generates text (a causal LM) rather than classifying.
GENERATIVE_KINDS = frozenset({TaskKind.INSTRUCTION, TaskKind.PREFERENCE})
