"""Character-level tokenisation of Chinese text, shared by training, evaluation and serving.

Every character is one token, looked up in the model's ``vocab.txt`` (lower-cased, as ERNIE and
BERT Chinese vocabularies are); a character the vocabulary lacks is ``[UNK]``. One token per
character keeps NER spans exact without offset mapping, and needs no tokenizer library, so the
serving host and the runner read the same file the same way.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)


@dataclass
class Encoded:
    input_ids: list[int]
    token_type_ids: list[int]
    # How many characters of each text made it into the tokens (the rest was truncated).
    kept: tuple[int, int]
    truncated: bool


class CharTokenizer:
    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab
        self.ids = {token: i for i, token in enumerate(vocab)}
        missing = [t for t in (PAD, UNK, CLS, SEP) if t not in self.ids]
        if missing:
            raise ValueError(f"vocab.txt lacks the special token(s) {', '.join(missing)}")
        self.pad_id, self.unk_id = self.ids[PAD], self.ids[UNK]
        self.cls_id, self.sep_id = self.ids[CLS], self.ids[SEP]

    @classmethod
    def from_file(cls, path: str | Path) -> "CharTokenizer":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"the tokenizer's vocabulary {path} is missing")
        with path.open(encoding="utf-8") as f:
            return cls([line.rstrip("\n") for line in f])

    @classmethod
    def build(cls, texts: Iterable[str], max_size: int = 8000) -> "CharTokenizer":
        """A vocabulary of the most frequent characters of ``texts`` (presets)."""
        counts = Counter(ch.lower() for text in texts for ch in text)
        chars = [ch for ch, _n in counts.most_common(max_size) if ch not in SPECIAL_TOKENS]
        return cls([*SPECIAL_TOKENS, *sorted(chars)])

    def save(self, path: str | Path) -> None:
        Path(path).write_text("".join(t + "\n" for t in self.vocab), encoding="utf-8")

    def char_ids(self, text: str) -> list[int]:
        ids, unk = self.ids, self.unk_id
        return [ids.get(ch, ids.get(ch.lower(), unk)) for ch in text]

    def encode(self, text: str, text_b: str | None = None, max_length: int = 128) -> Encoded:
        """``[CLS] text [SEP]`` or ``[CLS] a [SEP] b [SEP]``, cut to ``max_length`` tokens
        (the longer text loses characters first)."""
        a = self.char_ids(text)
        if text_b is None:
            keep_a = min(len(a), max_length - 2)
            ids = [self.cls_id, *a[:keep_a], self.sep_id]
            return Encoded(ids, [0] * len(ids), (keep_a, 0), keep_a < len(a))
        b = self.char_ids(text_b)
        keep_a, keep_b, budget = len(a), len(b), max_length - 3
        while keep_a + keep_b > budget:
            if keep_a >= keep_b:
                keep_a -= 1
            else:
                keep_b -= 1
        ids = [self.cls_id, *a[:keep_a], self.sep_id, *b[:keep_b], self.sep_id]
        types = [0] * (keep_a + 2) + [1] * (keep_b + 1)
        return Encoded(ids, types, (keep_a, keep_b), keep_a < len(a) or keep_b < len(b))
