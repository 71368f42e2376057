"""Text normalisation of imported rows: Unicode NFC, optional full-width → half-width, trimmed."""

import unicodedata
from collections.abc import Callable

# Full-width ASCII variants (！ to ～) and the ideographic space map to their half-width forms.
# One character to one character, so NER offsets survive it.
_FULLWIDTH = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}


_is_nfc = unicodedata.is_normalized


class Normalizer:
    def __init__(self, fullwidth_to_halfwidth: bool = False) -> None:
        self.fullwidth = fullwidth_to_halfwidth

    def _unicode(self, value: str) -> str:
        if not unicodedata.is_normalized("NFC", value):
            value = unicodedata.normalize("NFC", value)
        if self.fullwidth:
            value = value.translate(_FULLWIDTH)
        return value

    def text(self, value: str) -> str:
        # The hot path of every import: _unicode inlined.
        if not _is_nfc("NFC", value):
            value = unicodedata.normalize("NFC", value)
        if self.fullwidth:
            value = value.translate(_FULLWIDTH)
        return value.strip()

    label = text

    def text_with_offsets(self, raw: str) -> tuple[str, Callable[[int], int]]:
        """The normalised text, and how a character offset of ``raw`` moves into it."""
        composed = self._unicode(raw)
        lead = len(composed) - len(composed.lstrip())
        text = composed.strip()
        same_length = len(composed) == len(raw)

        def remap(offset: int) -> int:
            moved = offset if same_length else len(self._unicode(raw[:offset]))
            return min(max(moved - lead, 0), len(text))

        return text, remap
