"""A causal LM scored on an evaluation set (``runtime.llm_eval``), on a model the job runner
trained: the options' log-likelihoods are those of the model read one token at a time with
no cache and no padding (batched, left-padded, continuations of several tokens too); the
choices, accuracies per subject and open questions' scores follow from them and the answers."""

from pathlib import Path

import numpy as np
import pytest

from runtime.generation import GenerationRequest, Generator, generate, position_ids
from runtime.llm_eval import choice_prompt, evaluate_set, option_logprobs
from tests.helpers.workdir import run_quietly
from tests.runtime.test_llm_runner import workdir

CHOICES = [
    {
        "question": "3加4等于几？",
        "A": "7",
        "B": "8",
        "C": "6",
        "D": "5",
        "answer": "A",
        "subject": "算术",
    },
    {
        "question": "请问5加6等于几？",
        "A": "10",
        "B": "11",
        "C": "12",
        "D": "9",
        "answer": "B",
        "subject": "算术",
    },
    {
        "question": "2加2等于几？",
        "A": "3",
        "B": "5",
        "C": "4",
        "D": "6",
        "answer": "C",
        "subject": "加法",
    },
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Generator:
    directory = workdir(tmp_path_factory.mktemp("eval"), "paddle", epochs=2, eval_generations=0)
    run_quietly(directory)
    return Generator(Path(directory) / "export")


def _alone(lm, prompt: list[int], tokens: list[int]) -> float:
    """log p(tokens | prompt), one forward a token, with no cache and no padding."""
    total = 0.0
    for k, token in enumerate(tokens):
        ids = np.asarray([prompt + tokens[:k]], "int64")
        mask = np.ones_like(ids)
        logits, _cache = lm.forward(ids, mask, position_ids(mask), None)
        z = logits[0].astype("float64")
        total += z[token] - z.max() - np.log(np.exp(z - z.max()).sum())
    return total


def test_option_likelihoods_are_the_models_and_the_scores_follow(model):
    g = model
    prompts = [g.tokenizer.prompt_ids(choice_prompt(r)) for r in CHOICES]
    assert len({len(p) for p in prompts}) > 1  # left padding in one batch
    for options in (("A", "B", "C", "D"), ("7。", "11。", "等于4", "不知道")):
        scores = option_logprobs(g.lm, g.tokenizer, prompts, batch_size=3, options=options)
        for i, prompt in enumerate(prompts):
            for j, option in enumerate(options):
                expected = _alone(g.lm, prompt, g.tokenizer.encode(option))
                assert scores[i, j] == pytest.approx(expected, abs=1e-4), (i, option)

    # The model's own greedy answer is an open question's perfect reference; another is not.
    own = generate(
        g.lm,
        g.tokenizer,
        [
            GenerationRequest(
                g.chat_prompt([{"role": "user", "content": "1加2等于几？"}]),
                max_tokens=16,
                temperature=0,
            )
        ],
    )[0]
    opens = [
        {"question": "1加2等于几？", "references": ["完全不同的一句话", own]},
        {"question": "1加2等于几？", "references": ["我不知道这道题"], "subject": "加法"},
    ]
    result = evaluate_set(g.lm, g.tokenizer, CHOICES + opens, max_new_tokens=16, batch_size=2)
    items, metrics = result["items"], result["metrics"]
    assert metrics["rows"] == 5 and metrics["choice_rows"] == 3 and metrics["open_rows"] == 2
    for item, score in zip(items, option_logprobs(g.lm, g.tokenizer, prompts), strict=False):
        assert item["choice_loglik"] == "ABCD"[int(np.argmax(score))]
    right = [x["choice_loglik"] == x["answer"] for x in items[:3]]
    assert metrics["accuracy_loglik"] == pytest.approx(sum(right) / 3, abs=1e-4)
    arithmetic = result["subjects"]["算术"]
    assert arithmetic["choice_rows"] == 2
    assert arithmetic["accuracy_loglik"] == pytest.approx(sum(right[:2]) / 2, abs=1e-4)
    assert result["subjects"]["加法"]["rows"] == 2  # a choice and an open question
    assert items[3]["generated"] == own
    assert items[3]["exact_match"] == items[3]["rouge_l"] == items[3]["bleu"] == 1.0
    assert items[4]["exact_match"] == 0.0 and items[4]["bleu"] < 1.0
    assert metrics["exact_match"] == 0.5
