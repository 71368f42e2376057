"""Test data the benchmarks share (not a benchmark: `make bench` skips files starting with _)."""

import random

LABELS = ["正面", "负面"]
POS, NEG = ["很好", "满意", "喜欢", "推荐", "不错"], ["很差", "失望", "讨厌", "退货", "糟糕"]
CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说"
    "产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使"
)


def review_rows(n: int, seed: int = 0, filler: tuple[int, int] = (18, 68)) -> list[dict]:
    """Reviews whose label one keyword decides (learnable in a few epochs), amid ``filler``
    random common characters."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        text = "".join(rng.choices(CHARS, k=rng.randint(*filler)))
        cut = rng.randint(0, len(text))
        word = rng.choice(POS if positive else NEG)
        rows.append({"text": text[:cut] + word + text[cut:], "label": LABELS[not positive]})
    return rows
