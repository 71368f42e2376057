"""Rows in the dataset's terms → model inputs and targets, and model outputs → predictions.

Framework-free (numpy only): every backend and runtime uses these, so a row is encoded the
same way in training, evaluation and serving, and a prediction has one shape per task kind:

- ``text_classification``, ``text_pair``: ``{"label", "score", "scores": {label: p}}``
- ``multi_label``: ``{"labels": [...], "scores": {label: p}}`` (labels with p ≥ threshold)
- ``ner``: ``{"entities": [{"start", "end", "label", "text", "score"}]}`` (character offsets,
  end exclusive, as in datasets)

Each prediction also carries ``truncated`` when the input was longer than the model's maximum.
"""

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.kinds import TaskKind
from runtime.tokenizer import CharTokenizer, Encoded

SINGLE, MULTI, TOKEN = "single", "multi", "token"
# The model head each task kind trains: one place for every backend. Keyed by members, found by
# a kind's plain string too (a StrEnum member is its value).
HEADS: dict[str, str] = {
    TaskKind.TEXT_CLASSIFICATION: SINGLE,
    TaskKind.TEXT_PAIR: SINGLE,
    TaskKind.MULTI_LABEL: MULTI,
    TaskKind.NER: TOKEN,
}
# The target that takes no loss (cross-entropy's ignore_index in every backend): a tagger's
# [CLS], [SEP] and padding, a chat model's tokens other than the assistant's.
IGNORE = -100
# The generative kinds train a causal LM (runtime.llm) with this objective, not a head.
OBJECTIVES: dict[str, str] = {TaskKind.INSTRUCTION: "sft", TaskKind.PREFERENCE: "dpo"}


def head_of(task_kind: str) -> str:
    try:
        return HEADS[task_kind]
    except KeyError:
        raise ValueError(f"no model head for the task kind {task_kind!r}") from None


@dataclass(frozen=True)
class LabelSpace:
    task_kind: str
    labels: tuple[str, ...]

    @property
    def head(self) -> str:
        return head_of(self.task_kind)

    @property
    def tags(self) -> tuple[str, ...]:
        """NER's BIO tags: O, then B- and I- of each entity type."""
        return ("O", *(f"{p}-{label}" for label in self.labels for p in ("B", "I")))

    @property
    def num_outputs(self) -> int:
        return len(self.tags) if self.head == TOKEN else len(self.labels)


def read_rows(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def is_labeled(task_kind: str, row: dict) -> bool:
    """Rows without an annotation do not train: NER rows count as labeled (no entity is an
    answer), the others need a label; a conversation needs the assistant's answer, and a
    preference pair its chosen and rejected responses."""
    if task_kind == "instruction":
        return bool(row.get("messages")) and row["messages"][-1]["role"] == "assistant"
    if task_kind == "preference":
        return bool(row.get("chosen") and row.get("rejected"))
    if task_kind == "ner":
        return "entities" in row and row["entities"] is not None
    if task_kind == "multi_label":
        return bool(row.get("labels"))
    return bool(row.get("label"))


def row_inputs(task_kind: str, item: dict | str) -> tuple[str, str | None]:
    """The text (and second text) of a row or of a serving input."""
    if task_kind == "text_pair":
        if not isinstance(item, dict):
            raise ValueError("a text_pair input is an object with text_a and text_b")
        return item["text_a"], item["text_b"]
    return (item if isinstance(item, str) else item["text"]), None


def encode(tokenizer: CharTokenizer, task_kind: str, item, max_length: int) -> Encoded:
    text, text_b = row_inputs(task_kind, item)
    return tokenizer.encode(text, text_b, max_length)


def target(space: LabelSpace, row: dict, enc: Encoded):
    index = {label: i for i, label in enumerate(space.labels)}
    if space.head == SINGLE:
        return index[row["label"]]
    if space.head == MULTI:
        vec = np.zeros(len(space.labels), dtype="float32")
        for label in row["labels"]:
            vec[index[label]] = 1.0
        return vec
    tag_index = {tag: i for i, tag in enumerate(space.tags)}
    kept = enc.kept[0]
    tags = [IGNORE] + [0] * kept + [IGNORE]
    for e in row.get("entities") or []:
        for pos in range(e["start"], min(e["end"], kept)):
            prefix = "B" if pos == e["start"] else "I"
            tags[pos + 1] = tag_index[f"{prefix}-{e['label']}"]
    return tags


@dataclass
class Example:
    enc: Encoded
    # By the head: a label index (single), a 0/1 vector (multi), tag ids per token (token).
    target: Any


def examples(
    space: LabelSpace, tokenizer: CharTokenizer, rows: list[dict], max_length: int
) -> list[Example]:
    out = []
    for row in rows:
        enc = encode(tokenizer, space.task_kind, row, max_length)
        out.append(Example(enc, target(space, row, enc)))
    return out


def collate(batch: list[Example], pad_id: int, head: str | None = None) -> dict[str, np.ndarray]:
    """Pad to the longest sequence of the batch: input_ids, token_type_ids, attention_mask, and
    labels when the examples have targets."""
    width = max(len(e.enc.input_ids) for e in batch)
    n = len(batch)
    ids = np.full((n, width), pad_id, dtype="int64")
    types = np.zeros((n, width), dtype="int64")
    mask = np.zeros((n, width), dtype="int64")
    for i, e in enumerate(batch):
        k = len(e.enc.input_ids)
        ids[i, :k] = e.enc.input_ids
        types[i, :k] = e.enc.token_type_ids
        mask[i, :k] = 1
    out: dict[str, np.ndarray] = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if head is not None and batch[0].target is not None:
        if head == SINGLE:
            out["labels"] = np.array([e.target for e in batch], dtype="int64")
        elif head == MULTI:
            out["labels"] = np.stack([e.target for e in batch]).astype("float32")
        else:
            tags = np.full((n, width), IGNORE, dtype="int64")
            for i, e in enumerate(batch):
                tags[i, : len(e.target)] = e.target
            out["labels"] = tags
    return out


def batches(
    items: list[Example], batch_size: int, *, shuffle_seed: int | None = None
) -> Iterator[list[Example]]:
    order = np.arange(len(items))
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(order)
    for start in range(0, len(items), batch_size):
        yield [items[i] for i in order[start : start + batch_size]]


def steps_per_epoch(n: int, batch_size: int) -> int:
    return max(1, math.ceil(n / batch_size))


# -- outputs → predictions --------------------------------------------------------------------


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def decode(
    space: LabelSpace,
    logits: np.ndarray,
    encs: list[Encoded],
    items: list,
    threshold: float = 0.5,
) -> list[dict]:
    """Model outputs of a batch (logits: [B, C] or [B, T, C]) → one prediction per input."""
    labels = space.labels
    preds: list[dict] = []
    if space.head == SINGLE:
        probs = _softmax(logits.astype("float64"))
        for p, enc in zip(probs, encs, strict=True):
            best = int(p.argmax())
            preds.append(
                {
                    "label": labels[best],
                    "score": float(p[best]),
                    "scores": {label: float(p[i]) for i, label in enumerate(labels)},
                    "truncated": enc.truncated,
                }
            )
        return preds
    if space.head == MULTI:
        probs = _sigmoid(logits.astype("float64"))
        for p, enc in zip(probs, encs, strict=True):
            chosen = [label for i, label in enumerate(labels) if p[i] >= threshold]
            preds.append(
                {
                    "labels": chosen,
                    "scores": {label: float(p[i]) for i, label in enumerate(labels)},
                    "truncated": enc.truncated,
                }
            )
        return preds
    probs = _softmax(logits.astype("float64"))
    for p, enc, item in zip(probs, encs, items, strict=True):
        text = row_inputs(space.task_kind, item)[0]
        n = enc.kept[0]
        entities = _spans(text, p[1 : n + 1], space.tags)
        preds.append({"entities": entities, "truncated": enc.truncated})
    return preds


def _spans(text: str, probs: np.ndarray, tags: tuple[str, ...]) -> list[dict]:
    """BIO tags per character → entities; an I-x without its B-x starts an entity too, and
    a span's score is the mean probability of its tags."""
    best = probs.argmax(axis=-1)
    found: list[tuple[int, int, str, list[float]]] = []
    for pos, tag_id in enumerate(best):
        tag, score = tags[int(tag_id)], float(probs[pos, tag_id])
        if tag == "O":
            continue
        last = found[-1] if found else None
        if tag.startswith("I-") and last and last[1] == pos and last[2] == tag[2:]:
            found[-1] = (last[0], pos + 1, last[2], [*last[3], score])
        else:
            found.append((pos, pos + 1, tag[2:], [score]))
    return [
        {"start": s, "end": e, "label": lab, "text": text[s:e], "score": float(np.mean(sc))}
        for s, e, lab, sc in found
    ]
