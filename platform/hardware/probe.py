"""What accelerators this node has, as the frameworks see them: prints one JSON object.

Run by the train worker at start (``manage.py train_worker``) with the runtime venv's Python,
where Paddle and torch are installed; needs nothing else. console/hardware.py turns the facts
into devices with the profiles beside this file (each profile's ``detect`` says which fact
finds it). Every framework is optional: what fails to import is reported, not fatal.
"""

import json
import os
import sys


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def probe_paddle() -> dict:
    try:
        import paddle
    except Exception as exc:  # any import failure means "no Paddle here"
        return {"error": f"{type(exc).__name__}: {exc}"}
    facts: dict = {
        "version": paddle.__version__,
        "cuda": paddle.is_compiled_with_cuda(),
        "rocm": paddle.is_compiled_with_rocm(),
        "xpu": paddle.is_compiled_with_xpu(),
        "device_types": list(paddle.device.get_all_device_type()),
        "custom": {},
        "devices": [],
    }
    if facts["cuda"] or facts["rocm"]:
        kind = "rocm" if facts["rocm"] else "cuda"
        for i in range(paddle.device.cuda.device_count()):
            props = paddle.device.cuda.get_device_properties(i)
            facts["devices"].append(
                {"detect": kind, "index": i, "name": props.name, "memory": props.total_memory}
            )
    if facts["xpu"]:
        for i in range(paddle.device.xpu.device_count()):
            facts["devices"].append({"detect": "xpu", "index": i, "name": "XPU", "memory": None})
    for kind in paddle.device.get_all_custom_device_type() or []:
        found = [d for d in paddle.device.get_available_custom_device() or [] if d.startswith(kind)]
        facts["custom"][kind] = len(found)
        for name in found:
            index = int(name.rpartition(":")[2] or 0)
            facts["devices"].append(
                {"detect": f"custom:{kind}", "index": index, "name": name, "memory": None}
            )
    return facts


def probe_torch() -> dict:
    try:
        import torch
    except Exception as exc:  # likewise
        return {"error": f"{type(exc).__name__}: {exc}"}
    facts: dict = {"version": torch.__version__, "cuda": torch.cuda.is_available(), "devices": []}
    if facts["cuda"]:
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts["devices"].append(
                {"detect": kind, "index": i, "name": props.name, "memory": props.total_memory}
            )
    return facts


def _safely(probe) -> dict:
    """A framework that fails half-way (a driver error on a card) is reported, not fatal."""
    try:
        return probe()
    except Exception as exc:  # the other framework's facts still count
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    os.environ.setdefault("USE_TF", "0")
    facts = {
        "cpu": {"cores": os.cpu_count(), "memory": _memory_bytes()},
        "paddle": _safely(probe_paddle),
        "torch": _safely(probe_torch) if "--no-torch" not in sys.argv else {"error": "skipped"},
    }
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
