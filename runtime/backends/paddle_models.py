"""The fast models of the CPU presets (``runtime.presets.FAST_PRESETS``), in Paddle.

They take the inputs every encoder of the platform takes (``input_ids`` and, for pairs,
``token_type_ids`` of the character tokenizer, [PAD] = 0), so the serving host and the
predictor run them as they run an ERNIE model:

- ``NgramBag`` (classification, multi-label, pairs): each character's embedding plus those of
  the character 2- and 3-grams ending at it, hashed into buckets inside the graph (no n-gram
  vocabulary to ship), optionally a convolution over them; mean and max pooling; a linear
  head. Pairs pool each text apart and classify ``[u, v, |u-v|, u*v]``. A fastText/CNN-shaped
  model: a few minutes for 20 k rows on two cores.
- ``BiGRUCRF`` (NER): character and bigram embeddings, a bidirectional GRU, per-character tag
  scores and a linear-chain CRF (PaddleNLP's ``LinearChainCrf``). The export gives the tag
  scores; the CRF's transitions travel as ``crf.json`` and ``runtime.data`` decodes the best
  tag path (Viterbi, BIO-constrained) on any runtime.

Weights are safetensors and ``config.json`` (its ``architecture`` names the class). The
n-gram tables have sparse gradients: they train with Adam's lazy mode (``optimizer``).
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle import nn

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CRF_FILE = "crf.json"
_PRIME = 1_000_003  # multiplier of the in-graph n-gram hash; ids stay far below int64's range


def _shift(ids: paddle.Tensor, by: int) -> paddle.Tensor:
    """``ids`` moved ``by`` places right (positive) or left (negative), padded with [PAD]."""
    if by == 0:
        return ids
    pad = paddle.zeros([ids.shape[0], abs(by)], dtype=ids.dtype)
    if by > 0:
        return paddle.concat([pad, ids[:, :-by]], axis=1)
    return paddle.concat([ids[:, -by:], pad], axis=1)


def _gram_ids(
    ids: paddle.Tensor, offsets: tuple[int, ...], buckets: int, salt: int = 0
) -> paddle.Tensor:
    """The bucket of the n-gram made of the characters at ``offsets`` from each position
    (``salt`` keeps n-grams of different orders apart)."""
    h = paddle.full_like(ids, salt)
    for off in offsets:
        h = (h * _PRIME + _shift(ids, -off)) % (1 << 40)
    return h % buckets


def _np_gram_ids(ids: np.ndarray, offsets: tuple[int, ...], buckets: int, salt: int) -> np.ndarray:
    """``_gram_ids`` of one unpadded row, in numpy: the same buckets."""
    h = np.full_like(ids, salt)
    for off in offsets:
        shifted = np.zeros_like(ids)
        if off < 0:
            shifted[-off:] = ids[:off]
        elif off > 0:
            shifted[:-off] = ids[off:]
        else:
            shifted = ids
        h = (h * _PRIME + shifted) % (1 << 40)
    return h % buckets


# The wide part's n-gram orders: TF-IDF's character 1- to 3-grams.
WIDE_ORDERS = (1, 2, 3)


def _ending_at(n: int) -> tuple[int, ...]:
    return tuple(range(-(n - 1), 1))


def _max_over_time(x: paddle.Tensor) -> paddle.Tensor:
    """[B, T, E] → [B, E]. A pooling layer: the backward of ``max`` is a hundred times slower
    on Paddle's CPU kernels."""
    return nn.functional.adaptive_max_pool1d(x.transpose([0, 2, 1]), 1).squeeze(-1)


class NgramBag(nn.Layer):
    def uses_token_types(self) -> bool:
        return self.pair

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        *,
        embedding_size: int = 128,
        buckets: int = 200_000,
        ngrams: tuple[int, ...] = (2, 3),
        conv_channels: int = 0,
        wide_buckets: int = 0,
        wide_lr: float = 10.0,
        pair: bool = False,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.buckets, self.ngrams, self.pair = buckets, tuple(ngrams), pair
        # The wide part (one text only): a linear model over the text's TF-IDF vector of
        # hashed character 1-3-grams, l2-normalised, as the classical baseline is; the
        # deep part learns what it misses. Its weights start at zero and learn ``wide_lr``
        # times faster than the rest: a normalised vector's weights grow large (as a logistic
        # regression's do), and Adam moves a weight by about its learning rate a step.
        self.wide_buckets = 0 if pair else wide_buckets
        self.wide_lr = wide_lr
        if self.wide_buckets:
            self.wide = nn.Embedding(
                self.wide_buckets,
                num_labels,
                weight_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)),
            )
            # Inverse document frequencies of the training rows (``fit_idf``), saved with the
            # weights: a buffer, not trained.
            self.register_buffer("idf", paddle.ones([self.wide_buckets, 1]), persistable=True)
        self.char = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
        # Sparse gradients: a step updates only the buckets its batch used (a dense table's
        # gradient and update cost more than the rest of the model).
        self.gram = nn.Embedding(buckets, embedding_size, sparse=True)
        self.conv = (
            nn.Conv1D(embedding_size, conv_channels, 3, padding=1) if conv_channels else None
        )
        width = 2 * embedding_size + (conv_channels or 0)
        self.dropout = nn.Dropout(dropout)
        if pair:
            self.hidden = nn.Linear(4 * width, width)
            self.out = nn.Linear(width, num_labels)
        else:
            self.out = nn.Linear(width, num_labels)

    def _tokens(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        x = self.char(input_ids)
        for n in self.ngrams:  # the n-gram ending at each character
            x = x + self.gram(_gram_ids(input_ids, tuple(range(-(n - 1), 1)), self.buckets))
        return self.dropout(x)

    def _pool(self, x: paddle.Tensor, conv: paddle.Tensor | None, mask: paddle.Tensor):
        m = mask.unsqueeze(-1)
        mean = (x * m).sum(axis=1) / paddle.clip(m.sum(axis=1), min=1.0)
        parts = [mean, _max_over_time(x + (m - 1.0) * 1e4)]
        if conv is not None:
            parts.append(_max_over_time(conv + (m - 1.0) * 1e4))
        return paddle.concat(parts, axis=-1)

    def fit_idf(self, rows: list[list[int]]) -> None:
        """The wide part's IDF from the training rows' ids (sklearn's smooth idf)."""
        if not self.wide_buckets:
            return
        df = np.zeros(self.wide_buckets, dtype="float64")
        for row in rows:
            ids = np.asarray(row, dtype="int64")
            grams = [
                _np_gram_ids(ids, _ending_at(n), self.wide_buckets, n)[n - 1 :] for n in WIDE_ORDERS
            ]
            df[np.unique(np.concatenate(grams))] += 1
        idf = np.log((1 + len(rows)) / (1 + df)) + 1
        self.idf.set_value(idf[:, None].astype("float32"))

    def _wide(self, input_ids: paddle.Tensor, real: paddle.Tensor) -> paddle.Tensor:
        """Logits of the l2-normalised TF-IDF vector (each occurrence counts)."""
        parts, squares = [], []
        for n in WIDE_ORDERS:
            grams = _gram_ids(input_ids, _ending_at(n), self.wide_buckets, n)
            weight = nn.functional.embedding(grams, self.idf).squeeze(-1) * real
            weight = weight * _shift(real, n - 1)  # the whole n-gram is text
            parts.append((self.wide(grams) * weight.unsqueeze(-1)).sum(axis=1))
            squares.append((weight * weight).sum(axis=1, keepdim=True))
        return paddle.add_n(parts) / paddle.sqrt(paddle.add_n(squares) + 1e-6)

    def forward(
        self, input_ids: paddle.Tensor, token_type_ids: paddle.Tensor | None = None
    ) -> paddle.Tensor:
        x = self._tokens(input_ids)
        conv = None
        if self.conv is not None:
            conv = nn.functional.relu(self.conv(x.transpose([0, 2, 1]))).transpose([0, 2, 1])
        real = (input_ids != 0).astype(x.dtype)
        if not self.pair:
            logits = self.out(self.dropout(self._pool(x, conv, real)))
            if self.wide_buckets:
                logits = logits + self._wide(input_ids, real)
            return logits
        assert token_type_ids is not None, "a pair model tells its texts apart by token types"
        second = token_type_ids.astype(x.dtype) * real
        u = self._pool(x, conv, real - second)
        v = self._pool(x, conv, second)
        features = paddle.concat([u, v, paddle.abs(u - v), u * v], axis=-1)
        hidden = nn.functional.relu(self.hidden(self.dropout(features)))
        return self.out(self.dropout(hidden))


class BiGRUCRF(nn.Layer):
    def uses_token_types(self) -> bool:
        return False

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        *,
        embedding_size: int = 128,
        hidden_size: int = 128,
        num_layers: int = 1,
        buckets: int = 100_000,
        dropout: float = 0.1,
    ) -> None:
        from paddlenlp.layers import LinearChainCrf

        super().__init__()
        self.buckets = buckets
        self.char = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
        self.gram = nn.Embedding(buckets, embedding_size, sparse=True)
        self.gru = nn.GRU(
            embedding_size,
            hidden_size,
            num_layers=num_layers,
            direction="bidirect",
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(2 * hidden_size, num_labels)
        self.crf = LinearChainCrf(num_labels, with_start_stop_tag=False)

    def forward(
        self, input_ids: paddle.Tensor, token_type_ids: paddle.Tensor | None = None
    ) -> paddle.Tensor:
        # The bigrams before and after each character: word boundaries, in a char model.
        x = (
            self.char(input_ids)
            + self.gram(_gram_ids(input_ids, (-1, 0), self.buckets))
            + self.gram(_gram_ids(input_ids, (0, 1), self.buckets))
        )
        lengths = (input_ids != 0).astype("int64").sum(axis=1)
        h, _ = self.gru(self.dropout(x), sequence_length=lengths)
        return self.out(self.dropout(h))

    def loss(self, emissions: paddle.Tensor, labels: paddle.Tensor, input_ids: paddle.Tensor):
        """The CRF's negative log-likelihood over each row's characters (between [CLS] and
        [SEP]: their targets are IGNORE)."""
        from paddlenlp.layers import LinearChainCrfLoss

        lengths = (input_ids != 0).astype("int64").sum(axis=1) - 2
        tags = paddle.where(labels[:, 1:] < 0, paddle.zeros_like(labels[:, 1:]), labels[:, 1:])
        nll = LinearChainCrfLoss(self.crf)(emissions[:, 1:], paddle.clip(lengths, min=1), tags)
        return nll.mean()

    def transitions(self) -> np.ndarray:
        return self.crf.transitions.numpy()


ARCHITECTURES = {"ngram_bag": NgramBag, "bigru_crf": BiGRUCRF}


def build(config: dict) -> nn.Layer:
    """A model from its ``config.json``: the architecture and the class's arguments."""
    args = {k: v for k, v in config.items() if k != "architecture"}
    if "ngrams" in args:
        args["ngrams"] = tuple(args["ngrams"])
    return ARCHITECTURES[config["architecture"]](**args)


def optimizer(model: nn.Layer, learning_rate: float, weight_decay: float):
    """Adam in lazy mode (only the rows a batch used move), with L2 decay on the dense layers'
    weights only: decoupled decay (AdamW) does not take sparse gradients."""
    sparse_or_free = ("gram", "wide", "bias")
    named = list(model.named_parameters())
    dense = [p for n, p in named if not any(k in n for k in sparse_or_free)]
    rest = [p for n, p in named if any(k in n for k in ("gram", "bias"))]
    groups: list[dict[str, Any]] = [{"params": rest}]
    wide = [p for n, p in named if n.startswith("wide.")]
    if wide:  # a group's learning_rate multiplies the schedule's (ParamAttr's does not)
        groups.append({"params": wide, "learning_rate": getattr(model, "wide_lr", 1.0)})
    if dense:
        groups.append({"params": dense, "weight_decay": weight_decay or None})
    return paddle.optimizer.Adam(learning_rate=learning_rate, parameters=groups, lazy_mode=True)


def save(model: nn.Layer, config: dict, directory: Path) -> None:
    from safetensors.numpy import save_file

    save_file({k: v.numpy() for k, v in model.state_dict().items()}, str(directory / WEIGHTS))
    (directory / CONFIG).write_text(json.dumps(config), "utf-8")


def load(directory: Path) -> tuple[nn.Layer, dict]:
    from safetensors.numpy import load_file

    config = json.loads((directory / CONFIG).read_text("utf-8"))
    model = build(config)
    model.set_state_dict(load_file(str(directory / WEIGHTS)))
    return model, config


def is_fast(directory: Path) -> bool:
    """Whether ``directory`` holds one of these models (not a PaddleNLP one)."""
    path = directory / CONFIG
    return path.is_file() and json.loads(path.read_text("utf-8")).get("architecture") in (
        ARCHITECTURES
    )
