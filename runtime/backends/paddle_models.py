"""The fast models of the CPU presets (``runtime.presets.FAST_PRESETS``), in Paddle.

They take the inputs every encoder of the platform takes (``input_ids`` and, for pairs,
``token_type_ids`` of the character tokenizer, [PAD] = 0), so the serving host and the
predictor run them as they run an ERNIE model:

- ``NgramBag`` (classification, multi-label, pairs): each character's embedding plus those of
  the character 2- and 3-grams ending at it, hashed into buckets inside the graph (no n-gram
  vocabulary to ship), optionally a convolution over them; mean and max pooling; a linear
  head. Pairs pool each text apart and classify ``[u, v, |u-v|, u*v]``. A fastText/CNN-shaped
  model: a few minutes for 20 k rows on two cores. One text: plus a wide part, the
  classical baseline solved before the first step in a table sized to the training rows'
  n-grams, beside whose held-out logits the deep part trains (``NgramBag.warm_start``).
- ``BiGRUCRF`` (NER): character and bigram embeddings, a bidirectional GRU, per-character tag
  scores and a linear-chain CRF (PaddleNLP's ``LinearChainCrf``). The export gives the tag
  scores; the CRF's transitions travel as ``crf.json`` and ``runtime.data`` decodes the best
  tag path (Viterbi, BIO-constrained) on any runtime.

Weights are safetensors and ``config.json`` (its ``architecture`` names the class). The
n-gram tables have sparse gradients: they train with Adam's lazy mode (``optimizer``).
"""

import json
from collections.abc import Sequence
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
    # A tensor factor, not a Python one: Paddle makes ``h * number`` a ``scale`` op, which
    # ONNX converters compute in float32 (wrong buckets).
    prime = paddle.full_like(ids, _PRIME)
    for off in offsets:
        h = (h * prime + _shift(ids, -off)) % (1 << 40)
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
# Training rows an n-gram must be in to count. 5-fold on 17,410 real reviews, macro-F1: this
# wide part 0.8549 with every n-gram, 0.8557 at 2; TF-IDF + LR 0.8531 on the same folds.
WIDE_MIN_DF = 2
# The most weights a wide table holds (64 MB): its rows are buckets, its columns the labels or
# tags, which the data chooses; past it the buckets are halved (``wide_buckets``).
WIDE_TABLE_MAX = 1 << 24
WIDE_MIN_BUCKETS = 1 << 12
# A classifier's wide table has this many buckets for each distinct n-gram of its training rows
# (rounded up to a power of two, at most the preset's): few collisions, as a vocabulary has.
# Real reviews (13,890 rows, 649 k distinct 1-3-grams) get 2^22.
WIDE_LOAD = 4
# The folds whose held-out wide logits the deep part trains beside (``NgramBag.warm_start``),
# for at most this many labels (each fold solves the wide part again).
WIDE_FOLDS = 5
WIDE_FOLDS_MAX_LABELS = 8
# The wide part of a tagger: the offsets of the characters each CRF feature joins.
# (A salt of its own keeps each template's features apart.)
CRF_TEMPLATES = tuple(
    enumerate(
        ((-2,), (-1,), (0,), (1,), (2,), (-2, -1), (-1, 0), (0, 1), (1, 2), (-1, 0, 1)), start=1
    )
)


def _ending_at(n: int) -> tuple[int, ...]:
    return tuple(range(-(n - 1), 1))


def wide_buckets(asked: int, outputs: int) -> int:
    """The buckets of a wide table for ``outputs`` labels or tags: ``asked``, halved until the
    table holds at most ``WIDE_TABLE_MAX`` weights (not below ``WIDE_MIN_BUCKETS``)."""
    buckets = asked
    while buckets > WIDE_MIN_BUCKETS and buckets * outputs > WIDE_TABLE_MAX:
        buckets //= 2
    return buckets


def sized_buckets(rows: Sequence[list[int]], most: int, outputs: int) -> int:
    """The buckets of a classifier's wide table for its training rows' ids: ``WIDE_LOAD`` for
    each distinct n-gram, a power of two, at most ``most`` and ``wide_buckets``' bound. The
    rows the solve reads (``warm_start``) count."""
    from runtime.baselines import MAX_TRAIN_ROWS

    grams = [
        _np_gram_ids(np.asarray(r, dtype="int64"), _ending_at(n), 1 << 40, n)[n - 1 :]
        for r in rows[:MAX_TRAIN_ROWS]
        for n in WIDE_ORDERS
    ]
    distinct = len(np.unique(np.concatenate(grams))) if grams else 0
    buckets = WIDE_MIN_BUCKETS
    while buckets < WIDE_LOAD * distinct and buckets < most:
        buckets *= 2
    return wide_buckets(min(buckets, most), outputs)


def _row_key(ids: np.ndarray) -> int:
    """The hash of a row's ids without the padding, the key of its held-out wide logits (the
    process's own: they are not kept)."""
    return hash(np.trim_zeros(np.asarray(ids, dtype="int64"), "b").tobytes())


def _nb_ratio(x, positive: np.ndarray) -> np.ndarray:
    """Each feature's naive-Bayes log-count ratio between the positive rows and the others
    (add-one smoothed), as NBSVM scales features by."""
    p = 1 + np.asarray(x[positive].sum(axis=0)).ravel()
    q = 1 + np.asarray(x[~positive].sum(axis=0)).ravel()
    return np.log(p / p.sum()) - np.log(q / q.sum())


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
        pair: bool = False,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.buckets, self.ngrams, self.pair = buckets, tuple(ngrams), pair
        self.num_labels = num_labels
        # The wide part (one text only): the classical baseline inside the model, a linear
        # model over the text's l2-normalised TF-IDF vector of hashed character 1-3-grams
        # (the baseline's logistic regression, plus NBSVM's for a two-way decision: ``_solve``),
        # solved before the first step (``warm_start``) and kept fixed; the deep part learns
        # what it misses. Buffers: saved and exported with the weights.
        self.wide_buckets = 0 if pair else wide_buckets
        # A training row's wide logits held out of the wide part's solve (``warm_start``).
        self.held_out: dict[int, np.ndarray] = {}
        if self.wide_buckets:
            self.register_buffer("idf", paddle.ones([self.wide_buckets, 1]), persistable=True)
            self.register_buffer(
                "wide_weight", paddle.zeros([self.wide_buckets, num_labels]), persistable=True
            )
            self.register_buffer("wide_bias", paddle.zeros([num_labels]), persistable=True)
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
        # With a wide part the deep part starts silent (a zero output layer): the model
        # starts as the solved wide part, which the first dev evaluation scores.
        zero = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
        self.out = nn.Linear(
            width,
            num_labels,
            weight_attr=zero if self.wide_buckets else None,
        )

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

    def _np_grams(self, ids: np.ndarray) -> np.ndarray:
        """The wide part's buckets of one unpadded row, every occurrence."""
        return np.concatenate(
            [_np_gram_ids(ids, _ending_at(n), self.wide_buckets, n)[n - 1 :] for n in WIDE_ORDERS]
        )

    def _solve(self, x, y: np.ndarray, head: str, start: list | None = None) -> tuple:
        """The wide part's weight and bias over the columns of ``x``, and the regressions
        fitted: the logistic regression of runtime.baselines (one-vs-rest for multi-label) by
        L-BFGS, as the baseline is trained; where a decision is binary (two labels, or a label
        of a multi-label row), plus a second regression over the features scaled by their
        naive-Bayes log-count ratio (NBSVM, Wang & Manning 2012). The two are one linear model
        over the same features (the ratio folds into the weight). Measured on 17,410 real
        product reviews, 5-fold: +0.4 % macro-F1 over the regression alone in every fold.
        ``start``: the regressions of an earlier solve to start from (a fold's, from the
        whole's: L-BFGS then needs a few iterations)."""
        from scipy import sparse

        from runtime.baselines import LR_C, NB_LR_C, logistic

        def fit(c: float, features, column, begin):
            model = logistic(c)
            if begin is not None:
                model.set_params(warm_start=True)
                model.coef_, model.intercept_ = begin.coef_.copy(), begin.intercept_.copy()
            return model.fit(features, column)

        weight = np.zeros((x.shape[1], self.num_labels), dtype="float64")
        bias = np.zeros(self.num_labels, dtype="float64")
        columns = [y[:, j] for j in range(self.num_labels)] if head == "multi" else [y]
        fits: list = []
        for j, column in enumerate(columns):
            classes = np.unique(column)
            begin = start[j] if start else (None, None)
            if begin[0] is not None and not np.array_equal(begin[0].classes_, classes):
                begin = (None, None)  # a fold without some label: solved from zero
            if len(classes) < 2:
                fits.append((None, None))  # one class only: the deep part and the bias learn it
                continue
            lr = fit(LR_C, x, column, begin[0])
            if len(classes) > 2:
                weight[:, classes.astype(int)] = lr.coef_.T
                bias[classes.astype(int)] = lr.intercept_
                fits.append((lr, None))
                continue
            at = j if head == "multi" else int(classes[1])  # the column of the positive class
            positive = column == classes[1]
            ratio = _nb_ratio(x, positive)
            nb = fit(NB_LR_C, x @ sparse.diags(ratio), positive, begin[1])
            weight[:, at] = lr.coef_[0] + ratio * nb.coef_[0]
            bias[at] = lr.intercept_[0] + nb.intercept_[0]
            fits.append((lr, nb))
        return weight, bias, fits

    def warm_start(self, rows: list[list[int]], targets: list, head: str, resumed=False) -> str:
        """Solve the wide part on the training rows' ids and targets: IDF (sklearn's smooth
        idf; none below ``WIDE_MIN_DF`` rows), then the regressions (``_solve``); then the
        held-out logits the deep part trains beside (``_hold_out``). A resumed job keeps the
        wide part its checkpoint brings (solved again only as the folds' start) and holds out
        again. Returns what it did."""
        if not self.wide_buckets:
            return ""
        from scipy import sparse

        from runtime.baselines import MAX_TRAIN_ROWS

        rows, targets = rows[:MAX_TRAIN_ROWS], targets[:MAX_TRAIN_ROWS]
        grams = [self._np_grams(np.asarray(r, dtype="int64")) for r in rows]
        if resumed:
            idf = self.idf.numpy()[:, 0].astype("float64")
        else:
            df = np.zeros(self.wide_buckets, dtype="float64")
            for g in grams:
                df[np.unique(g)] += 1
            # An n-gram in fewer than WIDE_MIN_DF training rows weighs nothing, in the sum and
            # in the norm: a test row's n-grams never seen in training no longer shrink its
            # logits (the regression has no weight for them), and hapaxes no longer add noise
            # to NBSVM's ratios.
            idf = (np.log((1 + len(rows)) / (1 + df)) + 1) * (df >= WIDE_MIN_DF)
            self.idf.set_value(idf[:, None].astype("float32"))
        # The regressions see only the buckets that weigh (a solve's cost no longer grows with
        # the table); the others' weights stay zero, as L2 keeps a feature never set.
        used = np.flatnonzero(idf)
        column_of = np.full(self.wide_buckets, -1, dtype="int64")
        column_of[used] = np.arange(len(used))
        indptr = np.cumsum([0] + [len(g) for g in grams])
        cols = np.concatenate(grams)
        x = sparse.csr_matrix(
            (idf[cols], np.maximum(column_of[cols], 0), indptr),
            shape=(len(rows), max(len(used), 1)),
            dtype="float64",
        )
        x.sum_duplicates()  # as the graph does: each occurrence counts (a weightless one adds 0)
        # The norm the graph divides by (``_wide``): the root of the sum of each occurrence's
        # weight squared, so that the regression is solved on the very features it reads.
        rows_of = np.repeat(np.arange(len(rows)), np.diff(indptr))
        norms = np.sqrt(np.bincount(rows_of, weights=idf[cols] ** 2, minlength=len(rows)))
        x = sparse.diags(1 / np.maximum(norms, 1e-12)) @ x
        y = np.asarray(targets)
        if y.dtype.kind == "f":  # a teacher's scores (distillation): the decisions they make
            y = (y >= 0.5).astype("int64") if head == "multi" else y.argmax(axis=1)
        weight, bias, fits = self._solve(x, y, head)
        if not resumed:
            full = np.zeros((self.wide_buckets, self.num_labels), dtype="float32")
            full[used] = weight[: len(used)]
            self.wide_weight.set_value(full)
            self.wide_bias.set_value(bias.astype("float32"))
        done = (
            "" if resumed else f"wide part: logistic regression on {len(rows)} rows' TF-IDF n-grams"
        )
        held = self._hold_out(x, y, head, fits, rows)
        return "; ".join(filter(None, [done, held]))

    def _hold_out(self, x, y: np.ndarray, head: str, fits: list, rows: list) -> str:
        """Each training row's wide logits from a solve on the other folds' rows: in training
        the deep part learns beside these (``loss``), not beside the whole solve's, which fit
        the training rows almost perfectly and leave it nothing to learn. Measured on real
        reviews through the runner, 5 splits, with the table sized (2^22 buckets): +0.53 %
        macro-F1 over the default before (2^18, beside the whole solve), better in every
        split. Not past ``WIDE_FOLDS_MAX_LABELS`` labels or below ``WIDE_FOLDS`` rows a fold."""
        self.held_out = {}
        n = x.shape[0]
        if self.num_labels > WIDE_FOLDS_MAX_LABELS or n < WIDE_FOLDS * WIDE_FOLDS:
            return ""
        fold = np.random.default_rng(0).permutation(n) % WIDE_FOLDS
        logits = np.zeros((n, self.num_labels), dtype="float32")
        for k in range(WIDE_FOLDS):
            train, held = fold != k, fold == k
            weight, bias, _ = self._solve(x[train], y[train], head, start=fits)
            logits[held] = x[held] @ weight + bias
        self.held_out = {_row_key(r): logits[i] for i, r in enumerate(rows)}
        return f"held-out wide logits of {WIDE_FOLDS} folds"

    def _wide(self, input_ids: paddle.Tensor, real: paddle.Tensor) -> paddle.Tensor:
        """Logits of the l2-normalised TF-IDF vector (each occurrence counts)."""
        parts, squares = [], []
        for n in WIDE_ORDERS:
            grams = _gram_ids(input_ids, _ending_at(n), self.wide_buckets, n)
            weight = nn.functional.embedding(grams, self.idf).squeeze(-1) * real
            weight = weight * _shift(real, n - 1)  # the whole n-gram is text
            table = nn.functional.embedding(grams, self.wide_weight)
            parts.append((table * weight.unsqueeze(-1)).sum(axis=1))
            squares.append((weight * weight).sum(axis=1, keepdim=True))
        return paddle.add_n(parts) / paddle.sqrt(paddle.add_n(squares) + 1e-12) + self.wide_bias

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
            # In training beside held-out wide logits, ``loss`` adds them.
            if self.wide_buckets and not (self.training and self.held_out):
                logits = logits + self._wide(input_ids, real)
            return logits
        assert token_type_ids is not None, "a pair model tells its texts apart by token types"
        second = token_type_ids.astype(x.dtype) * real
        u = self._pool(x, conv, real - second)
        v = self._pool(x, conv, second)
        features = paddle.concat([u, v, paddle.abs(u - v), u * v], axis=-1)
        hidden = nn.functional.relu(self.hidden(self.dropout(features)))
        return self.out(self.dropout(hidden))

    def loss(self, logits: paddle.Tensor, labels: paddle.Tensor, input_ids: paddle.Tensor, head):
        """The head's loss of the deep part's logits plus each row's held-out wide logits (the
        whole solve's, in the graph, for a row without: one past the solve's rows)."""
        if not (self.training and self.held_out):
            return head(logits)
        keys = [_row_key(r) for r in input_ids.numpy()]
        if all(k in self.held_out for k in keys):
            held = np.stack([self.held_out[k] for k in keys])
        else:
            with paddle.no_grad():
                held = self._wide(input_ids, (input_ids != 0).astype(logits.dtype)).numpy()
            for i, k in enumerate(keys):
                held[i] = self.held_out.get(k, held[i])
        return head(logits + paddle.to_tensor(held).astype(logits.dtype))


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
        wide_buckets: int = 0,
        dropout: float = 0.1,
    ) -> None:
        from paddlenlp.layers import LinearChainCrf

        super().__init__()
        self.buckets, self.num_labels = buckets, num_labels
        # The wide part: the classical character CRF inside the model. Its features (the
        # characters within two places, the bigrams and the centred trigram, each template
        # hashed apart) and transitions are solved by crfsuite before the first step
        # (``warm_start``) and the features kept fixed; the BiGRU's tag scores are added.
        self.wide_buckets = wide_buckets
        if wide_buckets:
            self.register_buffer(
                "wide_weight", paddle.zeros([wide_buckets, num_labels]), persistable=True
            )
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
        zero = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
        self.out = nn.Linear(
            2 * hidden_size, num_labels, weight_attr=zero if wide_buckets else None
        )
        self.crf = LinearChainCrf(num_labels, with_start_stop_tag=False)

    def warm_start(self, rows: list[list[int]], targets: list, head: str, resumed=False) -> str:
        """Solve the wide part with crfsuite on the training rows' ids and tags (the
        baseline's solver, less regularised: ``WIDE_CRF_C1``): its feature weights and the
        transitions. A resumed job has them from its checkpoint."""
        if not self.wide_buckets or resumed:
            return ""
        from runtime.baselines import MAX_CRF_CHARS, WIDE_CRF_C1, WIDE_CRF_C2, linear_chain_crf

        xs: list[list[dict[str, float]]] = []
        ys: list[list[str]] = []
        chars = 0
        for row, tags in zip(rows, targets, strict=True):
            ids = np.asarray(row, dtype="int64")
            n = len(ids) - 2  # the characters between [CLS] and [SEP]
            if n < 1 or (chars + n > MAX_CRF_CHARS and xs):
                continue
            chars += n
            grams = [
                _np_gram_ids(ids, offsets, self.wide_buckets, salt)[1 : n + 1]
                for salt, offsets in CRF_TEMPLATES
            ]
            xs.append([{str(int(g[t])): 1.0 for g in grams} for t in range(n)])
            ys.append([str(max(int(tag), 0)) for tag in tags[1 : n + 1]])
        if not any(tag != "0" for seq in ys for tag in seq):
            return ""
        crf = linear_chain_crf(WIDE_CRF_C1, WIDE_CRF_C2)
        crf.fit(xs, ys)
        weight = np.zeros((self.wide_buckets, self.num_labels), dtype="float32")
        for (attr, tag), value in crf.state_features_.items():
            weight[int(attr), int(tag)] += value
        transitions = np.zeros((self.num_labels, self.num_labels), dtype="float32")
        for (a, b), value in crf.transition_features_.items():
            transitions[int(a), int(b)] = value
        self.wide_weight.set_value(weight)
        self.crf.transitions.set_value(transitions)
        return f"wide part: character CRF on {len(xs)} rows ({chars} characters)"

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
        emissions = self.out(self.dropout(h))
        if self.wide_buckets:
            features = []
            for salt, offsets in CRF_TEMPLATES:
                grams = _gram_ids(input_ids, offsets, self.wide_buckets, salt)
                features.append(nn.functional.embedding(grams, self.wide_weight))
            emissions = emissions + paddle.add_n(features)
        return emissions

    def loss(
        self, emissions: paddle.Tensor, labels: paddle.Tensor, input_ids: paddle.Tensor, _head
    ):
        """The CRF's negative log-likelihood over each row's characters (between [CLS] and
        [SEP]: their targets are IGNORE), in place of the head's loss."""
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
    named = list(model.named_parameters())
    dense = [p for n, p in named if not any(k in n for k in ("gram", "bias"))]
    rest = [p for n, p in named if any(k in n for k in ("gram", "bias"))]
    groups: list[dict[str, Any]] = [{"params": rest}]
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
