"""The causal-LM architectures teams fine-tune, each as a tiny random model of its own
architecture in its backend's layout (safetensors, a character tokenizer with the special
tokens and the chat template of the architecture's chat models, which the platform renders as
transformers does): LoRA fine-tuning (SFT) and DPO through the job runner, the export with LoRA
merged into the weights and the adapter beside it, and generation from the export by the serving
engine with continuous batching; the DPO version's adapter served over the SFT version, beside
it in one batch (``runtime.adapters``). ``ARCHITECTURES`` is what the base-models page says each was
tested with (``runtime.llm.TESTED``)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.adapters import AdapterError
from runtime.generation import GenerationRequest, Generator
from runtime.llm import TESTED
from tests.helpers.workdir import lora_workdir, run_quietly
from tests.runtime.test_llm_runner import sums

ROOT = Path(__file__).resolve().parent.parent.parent
# Config class prefixes of each library (PaddleNLP, transformers).
CLASSES = {"qwen2": "Qwen2", "ernie4_5": "Ernie4_5", "glm4": "Glm4", "mistral": "Mistral"}
# LLaMA's own tests are tests/runtime/test_llm_runner.py and tests/training/test_llm.py.
ARCHITECTURES = [(a, b) for a, backends in TESTED.items() if a != "llama" for b in backends]
# Each architecture's chat models' template (as their tokenizer_config.json has it), their
# special tokens and the token that ends the assistant's turn.
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ERNIE4_5 = (
    "{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = true -%}"
    "{%- endif -%}{%- if not cls_token is defined -%}"
    '{%- set cls_token = "<|begin_of_sentence|>" -%}{%- endif -%}'
    '{%- if not sep_token is defined -%}{%- set sep_token = "<|end_of_sentence|>" -%}'
    "{%- endif -%}{{- cls_token -}}{%- for message in messages -%}"
    '{%- if message["role"] == "user" -%}{{- "User: " + message["content"] + "\\n" -}}'
    '{%- elif message["role"] == "assistant" -%}'
    '{{- "Assistant: " + message["content"] + sep_token -}}'
    '{%- elif message["role"] == "system" -%}{{- message["content"] + "\\n" -}}'
    '{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{- "Assistant: " -}}'
    "{%- endif -%}"
)
GLM4 = (
    "[gMASK]<sop>{% for item in messages %}{% if item['tools'] is defined %}<|system|>\n"
    "你是一个名为 GLM-4 的人工智能助手。{% set tools = item['tools'] %}{% for tool in tools %}"
    "\n\n## {{ tool['function']['name'] }}\n\n{{ tool['function'] | tojson(indent=4) }}"
    "{% endfor %}{% endif %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}"
    "\n{{ item['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)
CHAT = {
    "qwen2": (QWEN2, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "<|im_end|>"),
    "ernie4_5": (ERNIE4_5, ["<|begin_of_sentence|>", "<|end_of_sentence|>"], "</s>"),
    "glm4": (
        GLM4,
        ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|endoftext|>"],
        "<|endoftext|>",
    ),
    "mistral": (MISTRAL, [], "</s>"),
}
MAKE = """
import json, sys, pathlib
from runtime.chat import build_char_tokenizer
name, backend, d = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
template, specials, end = json.loads(sys.argv[4])
tok = build_char_tokenizer(["0123456789加等于几？。我不知道userassistantsystem", template], d,
                           template=template, specials=tuple(specials), end_of_turn=end)
arch = dict(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=0)
# Seeded: the same weights in every session, so the same fine-tunings and answers.
if backend == "paddle":
    import paddle
    paddle.seed(0)
    import paddlenlp.transformers as lib
    arch["use_flash_attention"] = False
else:
    import torch
    torch.manual_seed(0)
    import transformers as lib
model = getattr(lib, name + "ForCausalLM")(getattr(lib, name + "Config")(**arch))
model.save_pretrained(str(d), safe_serialization=True)
# transformers' own rendering of the template: each conversation with and without the
# generation prompt, None where the template refuses it.
from transformers import AutoTokenizer
reference = AutoTokenizer.from_pretrained(str(d))
out = []
for conversation in json.loads(sys.argv[5]):
    for prompt in (True, False):
        try:
            out.append(reference.apply_chat_template(conversation, tokenize=False,
                                                     add_generation_prompt=prompt))
        except Exception:
            out.append(None)
(d / "rendered.json").write_text(json.dumps(out, ensure_ascii=False), "utf-8")
"""


TOOL = {"type": "function", "function": {"name": "add", "parameters": {"a": {"type": "int"}}}}
CONVERSATIONS = [
    [{"role": "user", "content": "3加4等于几？"}],
    [{"role": "user", "content": "3加4等于几？"}, {"role": "assistant", "content": "等于7。"}],
    [
        {"role": "system", "content": "你是计算器。", "tools": [TOOL]},
        {"role": "user", "content": "1加2？"},
        {"role": "assistant", "content": "3。"},
        {"role": "user", "content": "再加4？"},
    ],
]


def rendered_as_transformers_does(base: Path) -> None:
    """The platform's rendering (runtime.chat, in its bounded sandbox) of the conversations is
    transformers' own (``rendered.json``, which ``MAKE`` wrote), refusals included."""
    from runtime.chat import ChatTokenizer

    expected = json.loads((base / "rendered.json").read_text("utf-8"))
    tok, ours = ChatTokenizer(base), []
    for conversation in CONVERSATIONS:
        for prompt in (True, False):
            try:
                ours.append(tok.render(conversation, prompt))
            except Exception:
                ours.append(None)
    assert ours == expected
    assert any(expected)  # the template renders what the architecture's chat models take


def make_base(directory: Path, arch: str, backend: str) -> Path:
    # A process of its own: PaddleNLP and transformers each register their model classes.
    subprocess.run(
        [
            sys.executable,
            "-c",
            MAKE,
            CLASSES[arch],
            backend,
            str(directory),
            json.dumps(CHAT[arch], ensure_ascii=False),
            json.dumps(CONVERSATIONS, ensure_ascii=False),
        ],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    config = json.loads((directory / "config.json").read_text("utf-8"))
    assert config["model_type"] == arch
    return directory


def job(directory: Path, kind: str, rows: list[dict], backend: str, base: Path) -> Path:
    run_quietly(lora_workdir(directory, kind, rows, backend, base))
    return directory / "export"


def preferences(n: int) -> list[dict]:
    return [
        {
            "prompt": f"{a}加{b}等于几？",
            "chosen": f"{a}加{b}等于{a + b}。",
            "rejected": "我不知道。",
        }
        for a in range(1, 10)
        for b in range(1, 10)
    ][:n]


@pytest.mark.parametrize(("arch", "backend"), ARCHITECTURES)
def test_an_architecture_fine_tunes_with_lora_and_dpo_and_serves(tmp_path, arch, backend):
    base = make_base(tmp_path / "base", arch, backend)
    rendered_as_transformers_does(base)
    exports = {
        "sft": job(tmp_path / "sft", "instruction", sums(40), backend, base),
        "dpo": job(tmp_path / "dpo", "preference", preferences(24), backend, base),
    }
    for method, export in exports.items():
        manifest = json.loads((export / "manifest.json").read_text("utf-8"))
        assert manifest["runtime"] == f"{backend}_generate", method
        assert (export / "adapter").is_dir(), method  # the adapter alone, beside the merge
        config = json.loads((export / "config.json").read_text("utf-8"))
        assert config["model_type"] == arch
        generator = Generator(export)
        prompt = generator.chat_prompt([{"role": "user", "content": "3加4等于几？"}])
        batch = generator.batch()
        batch.add([GenerationRequest(prompt, max_tokens=4, temperature=0, id=i) for i in (1, 2)])
        steps = 0
        while len(batch):
            batch.step()
            steps += 1
        assert 1 <= steps <= 4

    # Many adapters on one base: the DPO version's adapter over the SFT version (whose own merged
    # adapter its rows leave out), in one batch with the SFT version's own rows: each row as its
    # version's merged export gives it.
    served = Generator(exports["sft"])
    assert served.load_adapter("prefs", exports["dpo"] / "adapter") > 0
    prompt = served.chat_prompt([{"role": "user", "content": "3加4等于几？"}])

    def run(generator: Generator, adapters: list[str]) -> tuple[np.ndarray, list[str]]:
        batch = generator.batch()
        batch.stop_ids = set()
        streams = batch.add(
            [GenerationRequest(prompt, 6, 0, id=i, adapter=a) for i, a in enumerate(adapters)]
        )
        first = batch.logits.copy()
        while len(batch):
            batch.step()
        return first, [s.text for s in streams]

    logits, texts = run(served, ["prefs", "", "prefs"])
    for method, rows in (("dpo", [0, 2]), ("sft", [1])):
        alone_logits, alone = run(Generator(exports[method]), [""])
        for row in rows:
            np.testing.assert_allclose(logits[row], alone_logits[0], atol=1e-4)
            assert texts[row] == alone[0], method
    assert np.abs(logits[0] - logits[1]).max() > 1e-3  # the adapter changes what it says
    with pytest.raises(AdapterError, match="no LoRA adapter"):
        served.load_adapter("merged", exports["sft"])  # a merged model is no adapter
