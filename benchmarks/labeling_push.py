"""Pushing tasks to Label Studio: 10,000 Chinese tasks of one dataset version through the
platform's push service (a fresh Label Studio project, batches, task ids recorded, existing
labels as predictions), against one bare SDK import of the same tasks (text and prediction)
into another fresh project, in the same run and the same Label Studio.

    make bench      # Label Studio from LABEL_STUDIO_URL/_TOKEN, or a throwaway one

Ends with one JSON line: tasks, push_s, bare_import_s, ratio.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import io, json, os, random, sys, time
sys.path.insert(0, sys.argv[1])
os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
call_command("migrate", verbosity=0)
from console.services import team_create
from labeling import services
from labeling.label_studio import client
n = int(sys.argv[2])
rng = random.Random(0)
chars = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工"
lines = ["文本,标签"] + [
    "".join(rng.choices(chars, k=rng.randint(10, 60))) + f"{i}," + rng.choice(["正面", "负面", ""])
    for i in range(n)
]
data = ("\n".join(lines) + "\n").encode()
user = get_user_model().objects.create_user("bench", password="x", is_staff=True)
team = team_create(actor=user, name="bench")
dataset = services.dataset_create(actor=user, team=team, name="reviews",
                                  task_kind="text_classification", labels=["正面", "负面"])
upload = services.upload_create(actor=user, team=team, filename="r.csv", size=len(data))
upload = services.upload_write_chunk(upload=upload, offset=0, stream=io.BytesIO(data),
                                     length=len(data))
mapping = {"text": "文本", "label": "标签"}
job = services.import_start(actor=user, dataset=dataset, upload=upload, fmt="csv",
                            encoding="utf-8", options={"mapping": mapping})
job.refresh_from_db()
version = job.version
# Eager Celery: the push task runs inside the create, as a worker would run it after.
t = time.perf_counter()
project = services.labeling_project_create(actor=user, version=version, name="bench")
project.refresh_from_db()
push_s = time.perf_counter() - t
assert project.tasks_pushed == n, project.tasks_pushed
ls = client()
config = services.schema_for("text_classification").label_config(["正面", "负面"])
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
    tasks = int(sys.argv[sys.argv.index("--tasks") + 1]) if "--tasks" in sys.argv else 10_000
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        env = {
            **os.environ,
            "PLATFORM_DATA_DIR": tmp,
            "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
            "SECRET_KEY": "benchmark-only-secret-key-0123456789",
            "CELERY_TASK_ALWAYS_EAGER": "1",
            "LOG_LEVEL": "WARNING",
        }
        command = [sys.executable, "-c", MEASURE, str(ROOT), str(tasks)]
        if not env.get("LABEL_STUDIO_URL"):
            command = [
                sys.executable,
                str(ROOT / "platform" / "label_studio.py"),
                "run",
                "--",
                *command,
            ]
        out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    push_s, bare_s = figures["push_s"], figures["bare_import_s"]
    print(f"platform push: {tasks} tasks in {push_s:.2f} s; bare SDK import: {bare_s:.2f} s")
    print(
        json.dumps(
            {
                "tasks": tasks,
                "push_s": round(push_s, 2),
                "bare_import_s": round(bare_s, 2),
                "ratio": round(push_s / bare_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
