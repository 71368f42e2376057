"""The restricted unpickler against the frameworks' own savers: what torch.save (zip and legacy
formats, bfloat16, views, sharded checkpoints) and paddle.save write converts to the same
tensors in safetensors; a tensor that points past its storage is refused."""

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from runtime import weights


def _state() -> dict:
    base = torch.arange(24, dtype=torch.float32)
    return {
        "weight": torch.randn(3, 4),
        "bf16": torch.randn(5).to(torch.bfloat16),
        "half": torch.randn(2, 2).half(),
        "ids": torch.arange(6, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "view": base[4:10].view(2, 3),  # an offset into a shared storage
        "transposed": base.view(4, 6).t(),  # non-contiguous strides
        "scalar": torch.tensor(3.5),
    }


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_save_converts_to_the_same_tensors(tmp_path, zip_format):
    state = _state()
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=zip_format)
    weights.convert_file(tmp_path / "pytorch_model.bin", tmp_path / "model.safetensors")
    converted = load_file(str(tmp_path / "model.safetensors"))
    assert converted.keys() == state.keys()
    for name, tensor in state.items():
        assert converted[name].dtype == tensor.dtype and torch.equal(converted[name], tensor)


def test_paddle_save_converts_to_the_same_arrays(tmp_path):
    import paddle

    state = {"w": paddle.randn([3, 4]), "b": paddle.zeros([4], dtype="int64")}
    paddle.save(state, str(tmp_path / "model_state.pdparams"))
    assert weights.convert_dir(tmp_path) == {"model_state.pdparams": "model.safetensors"}
    converted = weights.read_safetensors(tmp_path / "model.safetensors")
    for name, tensor in state.items():
        assert np.array_equal(converted[name].array, tensor.numpy())
    assert not (tmp_path / "model_state.pdparams").exists()


def test_a_tensor_past_its_storage_is_refused(tmp_path):
    """A crafted size or stride would read memory beyond the storage (as_strided): refused."""
    torch.save({"w": torch.zeros(4)}, tmp_path / "ok.bin")
    with zipfile.ZipFile(tmp_path / "ok.bin") as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    name = next(n for n in members if n.endswith("data.pkl"))
    # (4,) → (4096,): the same storage of four floats.
    assert members[name].count(b"K\x04\x85") == 1  # BININT1 4, TUPLE1: the size (4,)
    members[name] = members[name].replace(b"K\x04\x85", b"M\x00\x10\x85")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    (tmp_path / "bad.bin").write_bytes(buf.getvalue())
    with pytest.raises(weights.UnsafeWeights, match="past the end of its storage"):
        weights.convert_file(tmp_path / "bad.bin", tmp_path / "bad.safetensors")


def test_only_allowed_globals_resolve(tmp_path):
    (tmp_path / "x.bin").write_bytes(pickle.dumps(OrderedDict(a=np.ones(2)), protocol=2))
    assert weights.state_tensors(weights.load_checkpoint(tmp_path / "x.bin"), "x")["a"].dtype == (
        "F64"
    )
    (tmp_path / "eval.bin").write_bytes(pickle.dumps({"a": eval}))
    with pytest.raises(weights.UnsafeWeights, match=r"asks for builtins\.eval"):
        weights.load_checkpoint(tmp_path / "eval.bin")
    (tmp_path / "objects.bin").write_bytes(pickle.dumps({"a": np.array([print], dtype=object)}))
    with pytest.raises(weights.UnsafeWeights, match="Python objects"):
        weights.load_checkpoint(tmp_path / "objects.bin")


def test_sharded_checkpoints_and_other_pickles(tmp_path):
    from transformers import BertConfig, BertModel

    model = BertModel(
        BertConfig(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    model.save_pretrained(str(tmp_path), safe_serialization=False, max_shard_size="10KB")
    torch.save({"lr": 0.1}, tmp_path / "optimizer.pt")
    done = weights.convert_dir(tmp_path)
    assert done["pytorch_model.bin.index.json"] == "model.safetensors.index.json"
    assert done["optimizer.pt"] == ""  # left out, never read
    weights.refuse_pickles(tmp_path)  # nothing pickled is left
    again = BertModel.from_pretrained(str(tmp_path), use_safetensors=True)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    (tmp_path / "stray.pdparams").write_bytes(b"")
    with pytest.raises(weights.UnsafeWeights, match="never loads"):
        weights.refuse_pickles(Path(tmp_path))


def test_tied_weights_convert_and_an_expanded_view_is_refused(tmp_path):
    """Tied weights (an embedding and the LM head on one storage) are counted twice and still
    convert; a tensor expanded with stride 0 (many elements from one) is refused."""
    embedding = torch.randn(64, 32)
    torch.save({"embed.weight": embedding, "lm_head.weight": embedding}, tmp_path / "tied.bin")
    weights.convert_file(tmp_path / "tied.bin", tmp_path / "tied.safetensors")
    converted = load_file(str(tmp_path / "tied.safetensors"))
    assert torch.equal(converted["lm_head.weight"], embedding)
    torch.save({"w": torch.zeros(1).expand(1000, 1000)}, tmp_path / "expanded.bin")
    with pytest.raises(weights.UnsafeWeights, match="elements overlap"):
        weights.convert_file(tmp_path / "expanded.bin", tmp_path / "expanded.safetensors")
