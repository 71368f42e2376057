"""A causal LM scored on an evaluation set (issue #22): multiple-choice rows in the C-Eval and
CMMLU shape (``question``, options ``A``–``D``, ``answer``, ``subject``) and open questions
(``question`` and one or more ``references``).

- Multiple choice, by log-likelihood (as lm-evaluation-harness scores C-Eval and CMMLU): the
  question and its options as a user turn in the model's chat template, then each option's
  letter as the answer's tokens; the option whose tokens are likeliest is the model's choice.
  Prompts are scored in batches, left-padded, as the generation engine runs them.
- Multiple choice, by generation: the model answers greedily, and the first option letter it
  writes is its choice (none: wrong).
- Open questions: the model answers greedily; exact match (after dropping whitespace and
  punctuation) with any reference, character ROUGE-L and BLEU (sacrebleu's sentence BLEU with
  its Chinese tokenisation, a character a word) against the best reference.

Accuracy is overall and per subject; every row's scores are kept.
"""

import json
import re
import time
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from runtime.chat import ChatTokenizer
from runtime.generation import GenerationRequest, generate, position_ids
from runtime.metrics import rouge_l

OPTIONS = ("A", "B", "C", "D")
FIRST_OPTION = re.compile(r"[ABCD]")


def questions(rows: Iterable[dict]) -> list[dict]:
    """An evaluation set's questions (a row with its answer or a reference) in the order every
    evaluation numbers them: the train split's, the dev split's, then the test split's."""
    from runtime.data import is_labeled

    splits: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    for row in rows:
        if is_labeled("evaluation", row):
            splits.get(row.get("split") or "train", splits["train"]).append(row)
    return [row for split in splits.values() for row in split]


def is_choice(row: dict) -> bool:
    return all(row.get(o) for o in OPTIONS)


def choice_prompt(row: dict) -> list[dict]:
    """A multiple-choice row as the user's turn: C-Eval's wording, in Chinese."""
    subject = row.get("subject") or ""
    about = f"关于{subject}的" if subject else ""
    text = (
        f"以下是{about}单项选择题，请直接给出正确答案的选项。\n\n{row['question']}"
        + "".join(f"\n{o}. {row[o]}" for o in OPTIONS)
        + "\n答案："
    )
    return [{"role": "user", "content": text}]


def open_prompt(row: dict) -> list[dict]:
    return [{"role": "user", "content": row["question"]}]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype("float64")
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def option_logprobs(
    lm,
    tokenizer: ChatTokenizer,
    prompts: list[list[int]],
    batch_size: int = 8,
    options: tuple[str, ...] = OPTIONS,
) -> np.ndarray:
    """[rows, options]: the summed log-probability of each option's tokens (its letter) after
    each prompt. ``lm``: ``forward(ids, mask, positions, cache) → (last logits, cache)`` and the
    cache's ``select`` (``runtime.generation``)."""
    letters = [tokenizer.encode(o) for o in options]
    out = np.zeros((len(prompts), len(options)))
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = np.full((len(chunk), width), tokenizer.pad_id, dtype="int64")
        mask = np.zeros((len(chunk), width), dtype="int64")
        for i, p in enumerate(chunk):
            ids[i, width - len(p) :] = p
            mask[i, width - len(p) :] = 1
        positions = position_ids(mask)
        logits, cache = lm.forward(ids, mask, positions, None)
        first = _log_softmax(logits)
        for i in range(len(chunk)):
            for j, tokens in enumerate(letters):
                score = first[i, tokens[0]]
                if len(tokens) > 1:  # a letter of several tokens: the rest one step at a time
                    score += _rest(lm, cache, i, mask[i : i + 1], positions[i, -1], tokens)
                out[start + i, j] = score
    return out


def _rest(lm, cache, row: int, mask: np.ndarray, last: int, tokens: list[int]) -> float:
    """The log-probability of ``tokens[1:]`` after the prompt of ``row`` and ``tokens[0]``."""
    cache = lm.select(cache, [row])
    score = 0.0
    for k in range(len(tokens) - 1):
        mask = np.concatenate([mask, np.ones((1, 1), "int64")], axis=1)
        step = np.asarray([[tokens[k]]], "int64")
        logits, cache = lm.forward(step, mask, np.asarray([[last + 1 + k]], "int64"), cache)
        score += float(_log_softmax(logits)[0, tokens[k + 1]])
    return score


def _normal(text: str) -> str:
    """For exact match: no whitespace, no punctuation, NFKC (full-width to half-width)."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(c for c in text if not c.isspace() and not unicodedata.category(c)[0] == "P")


def bleu(candidate: str, references: list[str]) -> float:
    """Sentence BLEU (0–1) with sacrebleu's Chinese tokenisation, smoothed as it does."""
    import sacrebleu

    return sacrebleu.sentence_bleu(candidate, references, tokenize="zh").score / 100


def evaluate_set(
    lm,
    tokenizer: ChatTokenizer,
    rows: list[dict],
    *,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """``rows`` scored (module docstring): ``{"metrics", "subjects", "items"}``."""
    choice = [i for i, r in enumerate(rows) if is_choice(r)]
    open_ = [i for i, r in enumerate(rows) if not is_choice(r)]
    items: list[dict] = [{} for _ in rows]
    done = 0

    def progress(n: int) -> None:
        nonlocal done
        done += n
        if on_progress is not None:
            on_progress(done, 2 * len(choice) + len(open_))

    def answers(prompts: list[list[int]], max_tokens: int) -> list[str]:
        texts = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            requests = [GenerationRequest(p, max_tokens=max_tokens, temperature=0) for p in chunk]
            texts += generate(lm, tokenizer, requests)
            progress(len(chunk))
        return texts

    if choice:
        prompts = [tokenizer.prompt_ids(choice_prompt(rows[i])) for i in choice]
        scores = option_logprobs(lm, tokenizer, prompts, batch_size)
        progress(len(choice))
        written = answers(prompts, 8)
        for k, i in enumerate(choice):
            items[i] = choice_item(i, rows[i], written[k], scores[k])
    if open_:
        texts = answers([tokenizer.prompt_ids(open_prompt(rows[i])) for i in open_], max_new_tokens)
        for i, text in zip(open_, texts, strict=True):
            items[i] = open_item(i, rows[i], text)
    return summarise(items)


def choice_item(index: int, row: dict, written: str, scores=None) -> dict:
    """A multiple-choice row's scores: the choice its answer writes, and the likeliest option
    where the options' log-likelihoods are known (a model version's, not an endpoint's)."""
    found = FIRST_OPTION.search(written)
    item = {
        "row": index + 1,
        "type": "choice",
        "question": row["question"],
        "subject": row.get("subject") or "",
        "answer": row["answer"],
        "generated": written,
        "choice_generation": found[0] if found else None,
    }
    if scores is not None:
        item["loglik"] = [round(float(s), 4) for s in scores]
        item["choice_loglik"] = OPTIONS[int(np.argmax(scores))]
    return item


def open_item(index: int, row: dict, text: str) -> dict:
    """An open question's scores against its references."""
    references = row["references"]
    return {
        "row": index + 1,
        "type": "open",
        "question": row["question"],
        "subject": row.get("subject") or "",
        "references": references,
        "generated": text,
        "exact_match": float(any(_normal(text) == _normal(r) for r in references)),
        "rouge_l": round(max(rouge_l(text, r) for r in references), 4),
        "bleu": round(bleu(text, references), 4),
    }


def summarise(items: list[dict]) -> dict:
    """Every row's scores with the figures overall and per subject."""
    return {"metrics": _summary(items), "subjects": _by_subject(items), "items": items}


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _summary(items: list[dict]) -> dict:
    choice = [x for x in items if x["type"] == "choice"]
    open_ = [x for x in items if x["type"] == "open"]
    metrics: dict = {"rows": len(items), "choice_rows": len(choice), "open_rows": len(open_)}
    if choice and all("choice_loglik" in x for x in choice):
        metrics["accuracy_loglik"] = _mean([x["choice_loglik"] == x["answer"] for x in choice])
    if choice:
        metrics["accuracy_generation"] = _mean(
            [x["choice_generation"] == x["answer"] for x in choice]
        )
    if open_:
        for name in ("exact_match", "rouge_l", "bleu"):
            metrics[name] = _mean([x[name] for x in open_])
    return metrics


def _by_subject(items: list[dict]) -> dict[str, dict]:
    subjects: dict[str, list[dict]] = {}
    for x in items:
        if x["subject"]:
            subjects.setdefault(x["subject"], []).append(x)
    return {s: _summary(group) for s, group in sorted(subjects.items())}


def run_evaluation(spec, workdir: Path, emit) -> dict:
    """The job runner's objective "evaluate": the version in ``parent/export`` scored on every
    row of the evaluation set in ``data/``; ``evaluation.json`` holds the figures and the rows'
    scores, progress is reported as the rows are scored."""
    from runtime.compress import PARENT_DIR
    from runtime.data import read_rows
    from runtime.generation import Generator

    emit("state", phase="loading")
    generator = Generator(workdir / PARENT_DIR / "export", spec.device or "cpu")
    splits = [workdir / "data" / f"{split}.jsonl" for split in ("train", "dev", "test")]
    rows = questions(row for path in splits if path.exists() for row in read_rows(path))
    if not rows:
        raise ValueError("the evaluation set has no question with its answer or a reference")
    emit("log", message=f"{len(rows)} questions, scored with {spec.hp.max_new_tokens} new tokens")
    emit("state", phase="evaluating")
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        rate = done / max(time.perf_counter() - started, 1e-9)
        emit(
            "progress",
            step=done,
            total_steps=total,
            epoch=1,
            epochs=1,
            samples_per_s=round(rate, 2),
            eta_s=round((total - done) / rate, 1) if rate else None,
        )

    result = evaluate_set(
        generator.lm,
        generator.tokenizer,
        rows,
        max_new_tokens=spec.hp.max_new_tokens,
        batch_size=spec.hp.batch_size,
        on_progress=progress,
    )
    evaluation = {"split": "evaluation", "rows": len(rows), **result}
    evaluation["seconds"] = round(time.perf_counter() - started, 1)
    (workdir / "evaluation.json").write_text(
        json.dumps(evaluation, ensure_ascii=False), encoding="utf-8"
    )
    numbers = {k: v for k, v in result["metrics"].items() if isinstance(v, int | float)}
    emit("metrics", step=len(rows), split="evaluation", metrics=numbers)
    return evaluation
