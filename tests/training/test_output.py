"""The frameworks' chatter in a runner's output (training/output.py), told from the runner's
own lines, on lines Paddle, PaddleNLP and setuptools print (copied from a real job's log)."""

from training.output import OutputFilter

ESC = "\x1b"
OUTPUT = [
    # (line, is it noise?)
    ("32 training rows, 8 dev rows, 41 tokens in the vocabulary, 20 steps", False),
    (
        "/srv/.venv-runtime/lib/python3.11/site-packages/paddle/utils/cpp_extension/"
        "extension_utils.py:712: UserWarning: No ccache found. Please be aware that recompiling "
        "all source files may be required.",
        True,
    ),
    ("  warnings.warn(warning_message)", True),
    (
        "/srv/.venv-runtime/lib/python3.11/site-packages/_distutils_hack/__init__.py:30: "
        "UserWarning: Setuptools is replacing distutils.",
        True,
    ),
    ("  warnings.warn(", True),
    (
        "[2026-12-06 14:30:02,721] [    INFO] config.py:59 - PyTorch version 2.13.0+cpu available.",
        True,
    ),
    (
        f"{ESC}[33m[2026-12-06 14:30:04,251] [ WARNING]{ESC}[0m - Some weights of the model "
        "checkpoint at /tmp/export were not used when initializing the model",
        True,
    ),
    (
        "/srv/.venv-runtime/lib/python3.11/site-packages/paddlenlp/transformers/qwen2/"
        f"modeling.py:474: VisibleDeprecationWarning: {ESC}[93m",
        True,
    ),
    ("Warning:", True),
    ('API "paddle.incubate.nn.functional.swiglu.swiglu" is deprecated since 3.3.0.', True),
    ("    Reason: paddle.incubate.nn.functional.swiglu will be removed in future.", True),
    ("  x = self.act_fn(x, y)", True),
    (
        "W1206 07:17:03.142431 19847 eager_utils.cc:3584] Paddle static graph(PIR) not support "
        "input out tensor for now!!!!!",
        True,
    ),
    ("I1206 07:17:03.200000 19847 program_interpreter.cc:243] New Executor is Running.", True),
    ("macro_f1: model 0.9333 beats the baseline tfidf_char_lr 0.9000, majority 0.1961", False),
    ("baselines: ValueError: a label of one row only", False),
    # A traceback and glog's errors stay in the panel.
    ("Traceback (most recent call last):", False),
    ('  File "/srv/runtime/run.py", line 120, in main', False),
    ("E1206 07:17:04.000000 19847 pybind.cc:12] out of memory", False),
    ("[2026-12-06 14:30:05,000] [   ERROR] - the tokenizer is missing", False),
]


def test_the_frameworks_warnings_are_noise_and_the_runners_lines_are_not():
    f = OutputFilter()
    assert [(line, f.is_noise(line)) for line, _ in OUTPUT] == OUTPUT


def test_a_warning_without_its_source_line_ends_after_a_few_lines():
    f = OutputFilter()
    assert f.is_noise("/x/y.py:1: UserWarning: a message that goes on")
    assert all(f.is_noise(f"line {i} of it") for i in range(11))
    assert not f.is_noise("epoch 2: the runner speaks again")
