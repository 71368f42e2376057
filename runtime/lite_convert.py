"""The Paddle Lite side of the ``lite`` target (``runtime.lite``), run by the lite venv's Python
3.10 (paddlelite's wheels stop there): it imports only what that venv has (paddlepaddle 2.6,
paddlelite, numpy, safetensors), nothing of the platform.

- ``legacy CHECKPOINT OUT_STEM``: a fast model (``runtime.backends.paddle_models``: its
  ``config.json`` and safetensors) or a PaddleNLP ERNIE classifier or tagger (its
  ``config.json`` and ``model.safetensors``) rebuilt here for inference and saved as a legacy
  program (``OUT_STEM.pdmodel``): Paddle Lite's ``opt`` reads no PIR program, and Paddle 3 writes no
  other (its legacy IR no longer traces these models). The networks are those of
  ``paddle_models`` at inference (no dropout), with what Paddle 2.6 or ``opt`` would trip on
  written another way: no 0-d constants (``_no_0d_constants``), no empty slices, chained
  additions for ``add_n``, ``maximum(x, -x)`` for ``abs``, the max over time a reduction. The
  GRU is traced without ``sequence_length``: its rows are served one at a time without their
  padding (``runtime.lite``).
- ``convert MODEL PARAMS OUT_STEM [PLACES]``: ``opt`` to ``OUT_STEM.nb`` for x86 (or
  ``PLACES``: ``arm``); an operator it lacks it names ("These unsupported ops are: 'a'") and
  aborts.
- ``serve MODEL_NB``: a predictor reading requests on stdin and answering on stdout, each an
  8-byte little-endian length and an ``.npz``: the feed in (its inputs by name), the first
  output out (``logits``).
"""

import functools
import io
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

paddle: Any = None  # imported by _networks
nn: Any = None

PRIME = 1_000_003  # paddle_models._PRIME: the in-graph n-gram hash
WIDE_ORDERS = (1, 2, 3)
CRF_TEMPLATES = tuple(
    enumerate(
        ((-2,), (-1,), (0,), (1,), (2,), (-2, -1), (-1, 0), (0, 1), (1, 2), (-1, 0, 1)), start=1
    )
)


def shift(ids, by: int):
    """``ids`` moved ``by`` places right (positive) or left (negative), padded with 0. Made
    without a shape read at run time (0-d shapes) nor an empty slice (a row of two ids shifted
    by two), which Paddle Lite's kernels do not take."""
    if by == 0:
        return ids
    zero = paddle.zeros_like(ids[:, :1])
    pad = paddle.concat([zero] * abs(by), axis=1)
    if by > 0:
        return paddle.concat([pad, ids], axis=1)[:, :-by]
    return paddle.concat([ids, pad], axis=1)[:, -by:]


def gram_ids(ids, offsets: tuple[int, ...], buckets: int, salt: int = 0):
    h = paddle.full_like(ids, salt)
    prime = paddle.full_like(ids, PRIME)
    for off in offsets:
        h = (h * prime + shift(ids, -off)) % (1 << 40)
    return h % buckets


def total(parts: list):
    """The sum of ``parts``: ``add_n``, which ``opt`` lacks, as a chain of additions."""
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def ending_at(n: int) -> tuple[int, ...]:
    return tuple(range(-(n - 1), 1))


def _networks() -> dict:
    """The inference networks. Paddle is imported here, not by ``serve`` (Paddle Lite's own
    libraries); the methods, converted to a static graph, find it among the globals (the
    conversion loses a closure's names)."""
    global paddle, nn
    import paddle
    from paddle import nn

    class NgramBag(nn.Layer):
        def __init__(
            self,
            vocab_size: int,
            num_labels: int,
            embedding_size: int = 128,
            buckets: int = 200_000,
            ngrams=(2, 3),
            conv_channels: int = 0,
            wide_buckets: int = 0,
            pair: bool = False,
            **_unused,
        ) -> None:
            super().__init__()
            self.buckets, self.ngrams, self.pair = buckets, tuple(ngrams), pair
            self.wide_buckets = 0 if pair else wide_buckets
            if self.wide_buckets:
                self.register_buffer("idf", paddle.ones([self.wide_buckets, 1]))
                self.register_buffer("wide_weight", paddle.zeros([self.wide_buckets, num_labels]))
                self.register_buffer("wide_bias", paddle.zeros([num_labels]))
            self.char = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
            self.gram = nn.Embedding(buckets, embedding_size)
            self.conv = (
                nn.Conv1D(embedding_size, conv_channels, 3, padding=1) if conv_channels else None
            )
            width = 2 * embedding_size + (conv_channels or 0)
            if pair:
                self.hidden = nn.Linear(4 * width, width)
            self.out = nn.Linear(width, num_labels)

        def pool(self, x, conv, mask):
            m = mask.unsqueeze(-1)
            mean = (x * m).sum(axis=1) / paddle.clip(m.sum(axis=1), min=1.0)
            parts = [mean, (x + (m - 1.0) * 1e4).max(axis=1)]
            if conv is not None:
                parts.append((conv + (m - 1.0) * 1e4).max(axis=1))
            return paddle.concat(parts, axis=-1)

        def wide(self, input_ids, real):
            parts, squares = [], []
            for n in WIDE_ORDERS:
                grams = gram_ids(input_ids, ending_at(n), self.wide_buckets, n)
                weight = nn.functional.embedding(grams, self.idf).squeeze(-1) * real
                weight = weight * shift(real, n - 1)
                table = nn.functional.embedding(grams, self.wide_weight)
                parts.append((table * weight.unsqueeze(-1)).sum(axis=1))
                squares.append((weight * weight).sum(axis=1, keepdim=True))
            return total(parts) / paddle.sqrt(total(squares) + 1e-12) + self.wide_bias

        def forward(self, input_ids, token_type_ids=None):
            x = self.char(input_ids)
            for n in self.ngrams:
                x = x + self.gram(gram_ids(input_ids, ending_at(n), self.buckets))
            conv = None
            if self.conv is not None:
                conv = nn.functional.relu(self.conv(x.transpose([0, 2, 1]))).transpose([0, 2, 1])
            real = (input_ids != 0).astype(x.dtype)
            if not self.pair:
                logits = self.out(self.pool(x, conv, real))
                if self.wide_buckets:
                    logits = logits + self.wide(input_ids, real)
                return logits
            second = token_type_ids.astype(x.dtype) * real
            u = self.pool(x, conv, real - second)
            v = self.pool(x, conv, second)
            features = paddle.concat([u, v, paddle.maximum(u - v, v - u), u * v], axis=-1)
            return self.out(nn.functional.relu(self.hidden(features)))

    class BiGRUCRF(nn.Layer):
        def __init__(
            self,
            vocab_size: int,
            num_labels: int,
            embedding_size: int = 128,
            hidden_size: int = 128,
            num_layers: int = 1,
            buckets: int = 100_000,
            wide_buckets: int = 0,
            **_unused,
        ) -> None:
            super().__init__()
            self.buckets, self.wide_buckets = buckets, wide_buckets
            if wide_buckets:
                self.register_buffer("wide_weight", paddle.zeros([wide_buckets, num_labels]))
            self.char = nn.Embedding(vocab_size, embedding_size, padding_idx=0)
            self.gram = nn.Embedding(buckets, embedding_size)
            self.gru = nn.GRU(embedding_size, hidden_size, num_layers, direction="bidirect")
            self.out = nn.Linear(2 * hidden_size, num_labels)

        def forward(self, input_ids):
            x = (
                self.char(input_ids)
                + self.gram(gram_ids(input_ids, (-1, 0), self.buckets))
                + self.gram(gram_ids(input_ids, (0, 1), self.buckets))
            )
            h, _ = self.gru(x)  # rows come unpadded, one at a time
            emissions = self.out(h)
            if self.wide_buckets:
                features = [
                    nn.functional.embedding(
                        gram_ids(input_ids, offsets, self.wide_buckets, salt), self.wide_weight
                    )
                    for salt, offsets in CRF_TEMPLATES
                ]
                emissions = emissions + total(features)
            return emissions

    class Ernie(nn.Layer):
        """PaddleNLP's ``ErnieForSequenceClassification`` / ``ErnieForTokenClassification``
        at inference, from its ``config.json``, with the same parameter names: PaddleNLP
        builds it of ``nn.TransformerEncoderLayer``, as here (Paddle 2.6 has no PaddleNLP)."""

        def __init__(self, token: bool, **c) -> None:
            super().__init__()
            h = c["hidden_size"]
            self.token, self.pad = token, c.get("pad_token_id", 0)
            self.task_id = c.get("task_id", 0) if c.get("use_task_id") else None
            self.ernie = nn.Layer()
            e = self.ernie.embeddings = nn.Layer()
            e.word_embeddings = nn.Embedding(c["vocab_size"], h)
            e.position_embeddings = nn.Embedding(c["max_position_embeddings"], h)
            if c.get("type_vocab_size", 2) > 0:
                e.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), h)
            if self.task_id is not None:
                e.task_type_embeddings = nn.Embedding(c.get("task_type_vocab_size", 3), h)
            e.layer_norm = nn.LayerNorm(h)  # PaddleNLP's default epsilon, not layer_norm_eps
            layer = nn.TransformerEncoderLayer(
                h,
                c["num_attention_heads"],
                c["intermediate_size"],
                dropout=0.0,
                activation=c.get("hidden_act", "gelu"),
                normalize_before=False,
            )
            self.ernie.encoder = nn.TransformerEncoder(layer, c["num_hidden_layers"])
            if not token:
                self.ernie.pooler = nn.Layer()
                self.ernie.pooler.dense = nn.Linear(h, h)
            self.classifier = nn.Linear(h, len(c["id2label"]))

        def forward(self, input_ids, token_type_ids):
            e = self.ernie.embeddings
            ones = paddle.ones_like(input_ids)
            x = e.word_embeddings(input_ids) + e.position_embeddings(
                paddle.cumsum(ones, axis=-1) - ones
            )
            if hasattr(e, "token_type_embeddings"):
                x = x + e.token_type_embeddings(token_type_ids)
            if self.task_id is not None:
                x = x + e.task_type_embeddings(ones * self.task_id)
            x = e.layer_norm(x)
            padding = (input_ids == self.pad).astype("float32") * -1e4
            x = self.ernie.encoder(x, paddle.unsqueeze(padding, axis=[1, 2]))
            if self.token:
                return self.classifier(x)
            return self.classifier(paddle.tanh(self.ernie.pooler.dense(x[:, 0])))

    return {
        "ngram_bag": NgramBag,
        "bigru_crf": BiGRUCRF,
        "ErnieForSequenceClassification": functools.partial(Ernie, False),
        "ErnieForTokenClassification": functools.partial(Ernie, True),
    }


def architecture_of(config: dict) -> str | None:
    """A fast model's ``architecture``, or a PaddleNLP model's class (``architectures``)."""
    return config.get("architecture") or next(iter(config.get("architectures") or []), None)


def legacy(checkpoint: Path, out_stem: Path) -> None:
    import paddle
    from paddle.static import InputSpec
    from safetensors.numpy import load_file

    paddle.set_device("cpu")
    config = json.loads((checkpoint / "config.json").read_text("utf-8"))
    architecture = architecture_of(config)
    config.pop("architecture", None)
    networks = _networks()
    if architecture not in networks:
        raise SystemExit(f"no lite network for the {architecture!r} architecture")
    model = networks[architecture](**config)
    weights = load_file(str(checkpoint / "model.safetensors"))
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    if missing:
        raise SystemExit(f"the checkpoint lacks {', '.join(missing)}")
    # The CRF's transitions and the GRU's per-cell copies of its weights are not read here.
    model.set_state_dict({k: v for k, v in weights.items() if k in own})
    model.eval()
    specs = [InputSpec([None, None], "int64", name="input_ids")]
    if config.get("pair") or "architectures" in config:  # ERNIE reads token types
        specs.append(InputSpec([None, None], "int64", name="token_type_ids"))
    static = paddle.jit.to_static(model, input_spec=specs)
    paddle.jit.save(static, str(out_stem))
    _no_0d_constants(out_stem.with_suffix(".pdmodel"))


def _no_0d_constants(model_file: Path) -> None:
    """Paddle 2.6 writes a scalar operand (``h % buckets``, a shape's dimension) as a
    ``fill_constant`` of shape []; Paddle Lite's fills no 0-d tensor: [1] broadcasts alike."""
    paddle.enable_static()
    program = paddle.static.Program.parse_from_string(model_file.read_bytes())
    for block in program.blocks:
        for op in block.ops:
            fed = any(op.input(name) for name in op.input_names)  # a shape given as tensors
            if op.type == "fill_constant" and not list(op.attr("shape")) and not fed:
                op._set_attr("shape", [1])
                for name in op.output_arg_names:
                    block.var(name).desc.set_shape([1])
    model_file.write_bytes(program.desc.serialize_to_string())


def convert(model_file: Path, params_file: Path, out_stem: Path, places: str) -> int:
    """``opt`` prints why it refuses a model on its own streams; the caller reads them."""
    from paddlelite.lite import Opt

    opt = Opt()
    opt.set_model_file(str(model_file))
    opt.set_param_file(str(params_file))
    opt.set_valid_places(places)
    opt.set_model_type("naive_buffer")
    opt.set_optimize_out(str(out_stem))
    opt.run()
    return 0 if Path(f"{out_stem}.nb").is_file() else 1


def _read(stream) -> bytes | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return stream.read(size)


def _write(stream, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


def serve(model_nb: Path) -> None:
    from paddlelite.lite import MobileConfig, create_paddle_predictor

    config = MobileConfig()
    config.set_model_from_file(str(model_nb))
    predictor = create_paddle_predictor(config)
    names = predictor.get_input_names()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may reach the answers' stream
    while (request := _read(stdin)) is not None:
        feed = np.load(io.BytesIO(request))
        for i, name in enumerate(names):
            predictor.get_input(i).from_numpy(np.ascontiguousarray(feed[name], dtype="int64"))
        predictor.run()
        answer = io.BytesIO()
        np.savez(answer, logits=predictor.get_output(0).numpy())
        _write(stdout, answer.getvalue())


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "legacy":
        legacy(Path(args[0]), Path(args[1]))
        return 0
    if command == "convert":
        places = args[3] if len(args) > 3 else "x86"
        return convert(Path(args[0]), Path(args[1]), Path(args[2]), places)
    if command == "serve":
        serve(Path(args[0]))
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
