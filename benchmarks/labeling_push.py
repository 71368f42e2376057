"""Pushing tasks to Label Studio: 10,000 Chinese tasks of one dataset version through the
platform's push service (a fresh Label Studio project, batches, task ids recorded, existing
labels as predictions), against one bare SDK import of the same tasks (text and prediction)
into another fresh project, in the same run and the same Label Studio.

    make bench      # or: .venv/bin/python benchmarks/labeling_push.py [--tasks N] [--smoke]

Label Studio from LABEL_STUDIO_URL/_TOKEN, or a throwaway one.

Ends with one JSON line: tasks, push_s, bare_import_s, ratio.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, bench_env, parse, print_result

# argv = this folder (for _harness), the number of tasks; the environment is bench_env's.
MEASURE = r"""
import json, random, sys, time
sys.path.insert(0, sys.argv[1])
from _harness import bench_team, import_version, setup_django
setup_django()
from labeling.projects import labeling_project_create
from labeling import task_kinds
from labeling.label_studio import client
n = int(sys.argv[2])
rng = random.Random(0)
chars = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工"
lines = ["文本,标签"] + [
    "".join(rng.choices(chars, k=rng.randint(10, 60))) + f"{i}," + rng.choice(["正面", "负面", ""])
    for i in range(n)
]
data = ("\n".join(lines) + "\n").encode()
user, team = bench_team()
version = import_version(user, team, data, "csv", {"text": "文本", "label": "标签"})
# Eager Celery: the push task runs inside the create, as a worker would run it after.
t = time.perf_counter()
project = labeling_project_create(actor=user, version=version, name="bench")
project.refresh_from_db()
push_s = time.perf_counter() - t
assert project.tasks_pushed == n, project.tasks_pushed
ls = client()
config = task_kinds.get("text_classification").label_config(["正面", "负面"])
bare = ls.projects.create(title="bench bare", label_config=config)
# The same tasks: the text, and the existing label as a prediction.
tasks = []
for line in lines[1:]:
    text, label = line.rsplit(",", 1)
    task = {"data": {"text": text}}
    if label:
        result = [{"from_name": "label", "to_name": "text", "type": "choices",
                   "value": {"choices": [label]}}]
        task["predictions"] = [{"model_version": "bare", "result": result}]
    tasks.append(task)
t = time.perf_counter()
ls.projects.import_tasks(id=bare.id, request=tasks)
bare_s = time.perf_counter() - t
print(json.dumps({"tasks": n, "push_s": push_s, "bare_import_s": bare_s}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=10_000)
    tasks = parse(parser, smoke={"tasks": 20}).tasks
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        env = {**os.environ, **bench_env(Path(tmp)), "CELERY_TASK_ALWAYS_EAGER": "1"}
        command = [sys.executable, "-c", MEASURE, str(Path(__file__).parent), str(tasks)]
        if not env.get("LABEL_STUDIO_URL"):
            command = [
                sys.executable,
                str(ROOT / "platform" / "label_studio.py"),
                "run",
                "--",
                *command,
            ]
        out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode:  # the measuring process's own words
        sys.exit(f"the measuring process failed ({out.returncode}):\n{out.stderr[-4000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    push_s, bare_s = figures["push_s"], figures["bare_import_s"]
    print(f"platform push: {tasks} tasks in {push_s:.2f} s; bare SDK import: {bare_s:.2f} s")
    print_result(
        {
            "tasks": tasks,
            "push_s": round(push_s, 2),
            "bare_import_s": round(bare_s, 2),
            "ratio": round(push_s / bare_s, 2),
        }
    )


if __name__ == "__main__":
    main()
