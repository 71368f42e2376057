"""Predictions of the model in ``model/`` beside this file, with nothing but its runtime
(ONNX Runtime, Paddle Inference or Paddle Lite) and numpy: no platform, no Django.

    python predict.py inputs.jsonl > outputs.jsonl   # one JSON input a line (or stdin)
    python predict.py --check                         # examples.jsonl against expected.jsonl

An input is a text (a JSON string), ``{"text": …}``, or for a text pair
``{"text_a": …, "text_b": …}``; an output is what the platform's endpoint answers for it.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the bundle's own copy of the platform's runtime modules

from runtime.inference import Predictor  # noqa: E402


def decision(output: dict):
    """What an output decides (its label, labels or entity spans), scores aside."""
    if "entities" in output:
        return [(e["start"], e["end"], e["label"]) for e in output["entities"]]
    return output.get("label") or sorted(output.get("labels") or [])


def check(predictor: Predictor) -> int:
    inputs = [json.loads(line) for line in open(HERE / "examples.jsonl", encoding="utf-8")]
    wanted = [json.loads(line) for line in open(HERE / "expected.jsonl", encoding="utf-8")]
    got = predictor.predict(inputs)
    wrong = [
        i for i, (a, b) in enumerate(zip(got, wanted, strict=True)) if decision(a) != decision(b)
    ]
    print(f"{len(inputs) - len(wrong)} of {len(inputs)} examples as expected")
    for i in wrong:
        print(f"line {i + 1}: expected {decision(wanted[i])}, got {decision(got[i])}")
    return 1 if wrong else 0


def main(argv: list[str]) -> int:
    predictor = Predictor.load(HERE / "model")
    if argv[:1] == ["--check"]:
        return check(predictor)
    source = open(argv[0], encoding="utf-8") if argv else sys.stdin
    lines = [line for line in source if line.strip()]
    for start in range(0, len(lines), 32):
        for output in predictor.predict([json.loads(line) for line in lines[start : start + 32]]):
            print(json.dumps(output, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
