"""Rows in the dataset's terms → model inputs and targets, and model outputs → predictions.

Framework-free (numpy only): every backend and runtime uses these, so a row is encoded the
same way in training, evaluation and serving, and a prediction has one shape per task kind:

- ``text_classification``, ``text_pair``: ``{"label", "score", "scores": {label: p}}``
- ``multi_label``: ``{"labels": [...], "scores": {label: p}}`` (labels with p ≥ threshold)
- ``ner``: ``{"entities": [{"start", "end", "label", "text", "score"}]}`` (character offsets,
  end exclusive, as in datasets)

Each prediction also carries ``truncated``: true where part of the input was not read (a text
pair longer than the model's maximum, a text beyond ``MAX_WINDOWS`` windows), and ``windows``
where a long text was read in several (``predict``).

Long texts: a text longer than the model's maximum length is cut into overlapping windows
(``windows``) in training, evaluation and serving alike; ``predict`` pools their outputs.
"""

import functools
import json
import math
from collections.abc import Callable, Iterator
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
    if task_kind == "evaluation":  # a question with its answer or a reference
        return bool(row.get("answer") or row.get("references"))
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


def model_input(task_kind: str, row: dict) -> dict | str:
    """A row as a caller of the model gives it: the text, or a pair's two texts."""
    text, second = row_inputs(task_kind, row)
    return text if second is None else {"text_a": text, "text_b": second}


def encode(tokenizer: CharTokenizer, task_kind: str, item, max_length: int) -> Encoded:
    text, text_b = row_inputs(task_kind, item)
    return tokenizer.encode(text, text_b, max_length)


# Long texts. A window holds ``max_length - 2`` characters ([CLS] and [SEP] take the rest) and
# the next starts half a window later: each character but those of the first and last half
# windows is read twice, once in a window's middle half, where it has at least a quarter window
# of context on either side. A quarter stride would read each character four times for little
# more. A text of more than MAX_WINDOWS windows (about 4,100 characters at 128) is read to the
# end of the last and said to be ``truncated``: a bound on the work one input costs.
MAX_WINDOWS = 64


def text_windows(
    length: int, max_length: int, max_windows: int = MAX_WINDOWS
) -> tuple[list[tuple[int, int]], bool]:
    """The windows ``[start, end)`` that read a text of ``length`` characters with a model of
    ``max_length`` tokens, and whether characters are left unread (past ``max_windows``). One
    window where the text fits; else windows of ``max_length - 2`` characters, a stride of half
    a window, and the last one ending at the text's end."""
    size = max(1, max_length - 2)
    if length <= size:
        return [(0, length)], False
    stride = max(1, size // 2)
    starts = [*range(0, length - size, stride), length - size]
    if len(starts) > max_windows:
        return [(s, s + size) for s in starts[:max_windows]], True
    return [(s, s + size) for s in starts], False


def is_long(task_kind: str, item, max_length: int) -> bool:
    """Whether ``item`` is longer than a model of ``max_length`` tokens reads at once."""
    text, text_b = row_inputs(task_kind, item)
    if text_b is not None:
        return len(text) + len(text_b) > max_length - 3
    return len(text) > max_length - 2


def item_windows(
    tokenizer: CharTokenizer, task_kind: str, item, max_length: int
) -> tuple[list[tuple[int, Encoded]], bool]:
    """``item`` encoded window by window (``text_windows``): (the window's first character,
    its encoding) each, and whether characters were left unread. A text pair is one window as
    before: its longer text loses characters first (``CharTokenizer.encode``), as two texts
    read side by side have no windows that keep them aligned."""
    text, text_b = row_inputs(task_kind, item)
    if text_b is not None:
        enc = tokenizer.encode(text, text_b, max_length)
        return [(0, enc)], enc.truncated
    spans, cut = text_windows(len(text), max_length)
    return [(s, tokenizer.encode(text[s:e], None, max_length)) for s, e in spans], cut


def target(space: LabelSpace, row: dict, enc: Encoded, offset: int = 0):
    """The training target of ``row`` as ``enc`` holds it: ``enc`` starts at character
    ``offset`` of the text (a window of a long text, ``text_windows``)."""
    index = {label: i for i, label in enumerate(space.labels)}
    soft = soft_target(space, row)
    if soft is not None:
        return soft
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
    # An entity the window's edge cuts keeps the part inside: an entity begun before the window
    # continues in it (I- tags, no B-: its start is not there), one cut at the end begins (B-)
    # and is cut short. Neither O (a wrong answer) nor IGNORE (a CRF's loss reads it as O).
    for e in row.get("entities") or []:
        for pos in range(max(e["start"], offset), min(e["end"], offset + kept)):
            prefix = "B" if pos == e["start"] else "I"
            tags[pos - offset + 1] = tag_index[f"{prefix}-{e['label']}"]
    return tags


# A row's soft target (distillation, runtime.distill): a teacher's score per label.
SOFT = "soft_scores"


def soft_target(space: LabelSpace, row: dict) -> np.ndarray | None:
    """The row's soft target where it has one (``SOFT``) and the head can learn it: for one
    label, a distribution over the labels; for several, each label's probability. None for a
    tagger (a CRF learns no soft tags) or a row without one; a score that is not a probability
    of one of the labels is refused (ValueError), never learnt."""
    scores = row.get(SOFT)
    if scores is None or space.head == TOKEN:
        return None
    if not isinstance(scores, dict) or set(scores) != set(space.labels):
        raise ValueError(f"{SOFT} must give a score for each of the labels {list(space.labels)}")
    vec = np.array([scores[label] for label in space.labels], dtype="float64")
    if not np.all(np.isfinite(vec)) or vec.min() < 0 or vec.max() > 1:
        raise ValueError(f"{SOFT} must be probabilities between 0 and 1")
    if space.head == SINGLE:
        if vec.sum() <= 0:
            raise ValueError(f"{SOFT} must not all be 0")
        vec = vec / vec.sum()
    return vec.astype("float32")


@dataclass
class Example:
    enc: Encoded
    # By the head: a label index (single), a 0/1 vector (multi), tag ids per token (token); a
    # vector of probabilities where the row was labelled by a teacher (``soft_target``).
    target: Any


def examples(
    space: LabelSpace, tokenizer: CharTokenizer, rows: list[dict], max_length: int
) -> list[Example]:
    """One example per window of each row (``item_windows``): a long text trains on every part
    of it, each window with the row's label(s), or with the entities inside it."""
    out = []
    for row in rows:
        for offset, enc in item_windows(tokenizer, space.task_kind, row, max_length)[0]:
            out.append(Example(enc, target(space, row, enc, offset)))
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
        if head == SINGLE and any(isinstance(e.target, np.ndarray) for e in batch):
            n_labels = len(next(e.target for e in batch if isinstance(e.target, np.ndarray)))
            out["labels"] = np.stack([_distribution(e.target, n_labels) for e in batch])
        elif head == SINGLE:
            out["labels"] = np.array([e.target for e in batch], dtype="int64")
        elif head == MULTI:
            out["labels"] = np.stack([e.target for e in batch]).astype("float32")
        else:
            tags = np.full((n, width), IGNORE, dtype="int64")
            for i, e in enumerate(batch):
                tags[i, : len(e.target)] = e.target
            out["labels"] = tags
    return out


def _distribution(target, width: int) -> np.ndarray:
    """A single-label target as a distribution: a soft one as it is, a label index one-hot."""
    if isinstance(target, np.ndarray):
        return target.astype("float32")
    one_hot = np.zeros(width, dtype="float32")
    one_hot[target] = 1.0
    return one_hot


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


def _label_pred(labels: tuple[str, ...], p: np.ndarray, truncated: bool) -> dict:
    best = int(p.argmax())
    return {
        "label": labels[best],
        "score": float(p[best]),
        "scores": {label: float(p[i]) for i, label in enumerate(labels)},
        "truncated": truncated,
    }


def _multi_pred(labels: tuple[str, ...], p: np.ndarray, threshold: float, truncated: bool) -> dict:
    return {
        "labels": [label for i, label in enumerate(labels) if p[i] >= threshold],
        "scores": {label: float(p[i]) for i, label in enumerate(labels)},
        "truncated": truncated,
    }


def _entities(
    space: LabelSpace, text: str, logits: np.ndarray, transitions: np.ndarray | None
) -> list[dict]:
    """A text's characters' tag scores ([n, C], from its first character) → its entities."""
    logits = logits.astype("float64")
    path = None if transitions is None else viterbi(logits, transitions, space.tags)
    return _spans(text, _softmax(logits), space.tags, path)


def decode(
    space: LabelSpace,
    logits: np.ndarray,
    encs: list[Encoded],
    items: list,
    threshold: float = 0.5,
    transitions: np.ndarray | None = None,
) -> list[dict]:
    """Model outputs of a batch (logits: [B, C] or [B, T, C]) → one prediction per input, each
    read in one window (``predict`` reads long texts in several). A tagger with a CRF gives its
    ``transitions`` ([C, C], from tag to tag): its tags are the best path through them, else
    each character's most likely tag."""
    labels = space.labels
    if space.head == SINGLE:
        probs = _softmax(logits.astype("float64"))
        return [_label_pred(labels, p, e.truncated) for p, e in zip(probs, encs, strict=True)]
    if space.head == MULTI:
        probs = _sigmoid(logits.astype("float64"))
        return [
            _multi_pred(labels, p, threshold, e.truncated) for p, e in zip(probs, encs, strict=True)
        ]
    preds: list[dict] = []
    for lg, enc, item in zip(logits, encs, items, strict=True):
        text = row_inputs(space.task_kind, item)[0]
        entities = _entities(space, text, lg[1 : enc.kept[0] + 1], transitions)
        preds.append({"entities": entities, "truncated": enc.truncated})
    return preds


def predict(
    run_logits: Callable[[dict[str, np.ndarray]], np.ndarray],
    tokenizer: CharTokenizer,
    space: LabelSpace,
    items: list,
    max_length: int,
    threshold: float = 0.5,
    transitions: np.ndarray | None = None,
    batch_size: int = 32,
) -> list[dict]:
    """Inputs → predictions, the one way every caller predicts (the loop's dev evaluation, the
    exported model's ``Predictor`` in evaluation and on the serving host). Each input is read
    in its windows (``item_windows``), ``batch_size`` windows a model call (``run_logits``:
    inputs → logits), and its windows' outputs pooled:

    - single label: the mean of the windows' probabilities;
    - multi-label: the highest probability of each label in any window (a label is present
      where any part of the text shows it);
    - NER: each character's tag scores from the window where it is farthest from a cut (the
      text's own ends are no cut), merged into one [n, C] matrix of the whole text, decoded as
      one window is (the CRF's best path through it too): offsets are on the whole text.

    A prediction read in k > 1 windows says ``windows: k``."""
    preds: list[dict] = []
    # A chunk of inputs at a time: their windows' outputs are kept until each input is pooled.
    for first in range(0, len(items), batch_size):
        chunk = items[first : first + batch_size]
        cut = [item_windows(tokenizer, space.task_kind, it, max_length) for it in chunk]
        flat = [enc for wins, _ in cut for _, enc in wins]
        outputs: list[np.ndarray] = []
        for start in range(0, len(flat), batch_size):
            part = flat[start : start + batch_size]
            feed = collate([Example(e, None) for e in part], tokenizer.pad_id)
            outputs.extend(np.asarray(run_logits(feed)))
        at = 0
        for item, (wins, truncated) in zip(chunk, cut, strict=True):
            outs, at = outputs[at : at + len(wins)], at + len(wins)
            pred = _pooled(space, item, wins, outs, truncated, threshold, transitions)
            if len(wins) > 1:
                pred["windows"] = len(wins)
            preds.append(pred)
    return preds


def _pooled(
    space: LabelSpace,
    item,
    wins: list[tuple[int, Encoded]],
    outs: list[np.ndarray],
    truncated: bool,
    threshold: float,
    transitions: np.ndarray | None,
) -> dict:
    """One input's prediction from the outputs of its windows (``predict``)."""
    if space.head == SINGLE:
        probs = _softmax(np.stack(outs).astype("float64")).mean(axis=0)
        return _label_pred(space.labels, probs, truncated)
    if space.head == MULTI:
        probs = _sigmoid(np.stack(outs).astype("float64")).max(axis=0)
        return _multi_pred(space.labels, probs, threshold, truncated)
    text = row_inputs(space.task_kind, item)[0]
    read = wins[-1][0] + wins[-1][1].kept[0]  # the characters the windows cover
    merged = np.zeros((read, outs[0].shape[-1]), dtype="float64")
    best = np.full(read, -1.0)
    for (offset, enc), out in zip(wins, outs, strict=True):
        k = enc.kept[0]
        pos = np.arange(k, dtype="float64")
        left = pos if offset > 0 else np.full(k, np.inf)
        right = (k - 1 - pos) if offset + k < len(text) else np.full(k, np.inf)
        margin = np.minimum(left, right)
        take = margin > best[offset : offset + k]
        merged[offset : offset + k][take] = out[1 : k + 1][take]
        best[offset : offset + k] = np.maximum(best[offset : offset + k], margin)
    return {"entities": _entities(space, text, merged, transitions), "truncated": truncated}


@functools.lru_cache(maxsize=64)
def _allowed(tags: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """BIO's rules as masks: which tag may follow which ([C, C]), and which may start (read
    only: one pair per label set, shared by every row)."""
    inside = [t[2:] if t.startswith("I-") else None for t in tags]
    follow = np.ones((len(tags), len(tags)), dtype=bool)
    for j, kind in enumerate(inside):
        if kind is not None:  # I-x only after B-x or I-x
            follow[:, j] = [t[2:] == kind and t[0] in "BI" for t in tags]
    start = np.array([kind is None for kind in inside])
    follow.flags.writeable = start.flags.writeable = False
    return follow, start


def viterbi(emissions: np.ndarray, transitions: np.ndarray, tags: tuple[str, ...]) -> np.ndarray:
    """The tag path of highest score (emissions [n, C] plus transitions), never breaking BIO."""
    if not len(emissions):
        return np.zeros(0, dtype="int64")
    follow, start = _allowed(tags)
    trans = np.where(follow, transitions.astype("float64"), -1e9)
    score = np.where(start, emissions[0], -1e9)
    back = np.zeros(emissions.shape, dtype="int64")
    for t in range(1, len(emissions)):
        total = score[:, None] + trans  # [from, to]
        back[t] = total.argmax(axis=0)
        score = total.max(axis=0) + emissions[t]
    path = [int(score.argmax())]
    for t in range(len(emissions) - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return np.array(path[::-1], dtype="int64")


def _spans(
    text: str, probs: np.ndarray, tags: tuple[str, ...], path: np.ndarray | None = None
) -> list[dict]:
    """BIO tags per character (``path``, else the most likely of each) → entities; an I-x
    without its B-x starts an entity too, and a span's score is the mean probability of its
    tags."""
    best = probs.argmax(axis=-1) if path is None else path
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
