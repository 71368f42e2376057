"""Import speed and memory: one million rows of a GBK CSV through the platform's import service
(upload in chunks, import job, validation, dedup, splits, storage), against pandas.read_csv of
the same file, each in a process of its own so that peak RSS is its own.

    make bench            # or: .venv/bin/python benchmarks/dataset_import.py [--rows N] [--smoke]

Ends with one JSON line: rows, rows_per_s, peak_rss_mb, pandas_rows_per_s, pandas_peak_rss_mb,
speed_ratio_vs_pandas.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import bench_env, parse, print_result

LABELS = ["正面", "负面", "中性", "咨询", "投诉"]
CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说"
    "产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使"
    "点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明"
    "看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料"
)

# argv = the CSV file, this folder (for _harness); the environment is bench_env's.
PLATFORM = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[2])
from _harness import bench_team, setup_django
setup_django()
from labeling.datasets import dataset_create, upload_create, upload_write_chunk
from labeling.imports import import_start
path = sys.argv[1]
user, team = bench_team()
dataset = dataset_create(actor=user, team=team, name="reviews",
                                  task_kind="text_classification")
size = os.path.getsize(path)
t0 = time.perf_counter()
upload = upload_create(actor=user, team=team, filename="reviews.csv", size=size)
with open(path, "rb") as f:
    offset = 0
    while offset < size:
        n = min(8 * 2**20, size - offset)
        upload = upload_write_chunk(upload=upload, offset=offset, stream=f, length=n)
        offset += n
t1 = time.perf_counter()
job = import_start(actor=user, dataset=dataset, upload=upload, fmt="csv",
                            encoding="gbk", options={"mapping": {"text": "文本", "label": "标签"}})
job.refresh_from_db()  # CELERY_TASK_ALWAYS_EAGER: the task ran on commit, in this process
t2 = time.perf_counter()
assert job.status == "succeeded", job.error
print(json.dumps({"rows": job.rows_read, "seconds": t2 - t1, "upload_seconds": t1 - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

PANDAS = r"""
import json, resource, sys, time
import pandas as pd
t = time.perf_counter()
frame = pd.read_csv(sys.argv[1], encoding="gbk")
seconds = time.perf_counter() - t
print(json.dumps({"rows": len(frame), "seconds": seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def generate(path: Path, rows: int) -> None:
    rng = random.Random(0)  # noqa: S311 - reproducible test data
    with open(path, "w", encoding="gbk", newline="") as f:
        f.write("文本,标签\n")
        for i in range(rows):
            text = "".join(rng.choices(CHARS, k=rng.randint(8, 60)))
            f.write(f"{text}{i},{rng.choice(LABELS)}\n")


def measure(code: str, env: dict, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parse(parser, smoke={"rows": 1000})
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        csv_path = Path(tmp) / "reviews.csv"
        generate(csv_path, args.rows)
        env = {**os.environ, **bench_env(Path(tmp)), "CELERY_TASK_ALWAYS_EAGER": "1"}
        platform = measure(PLATFORM, env, str(csv_path), str(Path(__file__).parent))
        pandas = measure(PANDAS, env, str(csv_path))
    rows_per_s = platform["rows"] / platform["seconds"]
    pandas_rows_per_s = pandas["rows"] / pandas["seconds"]
    print(
        f"platform import: {platform['rows']} rows in {platform['seconds']:.1f} s "
        f"(upload {platform['upload_seconds']:.1f} s), peak RSS {platform['peak_rss_mb']:.0f} MB"
    )
    print(
        f"pandas.read_csv: {pandas['rows']} rows in {pandas['seconds']:.1f} s, "
        f"peak RSS {pandas['peak_rss_mb']:.0f} MB"
    )
    print_result(
        {
            "rows": platform["rows"],
            "rows_per_s": round(rows_per_s),
            "peak_rss_mb": round(platform["peak_rss_mb"], 1),
            "pandas_rows_per_s": round(pandas_rows_per_s),
            "pandas_peak_rss_mb": round(pandas["peak_rss_mb"], 1),
            "speed_ratio_vs_pandas": round(rows_per_s / pandas_rows_per_s, 3),
        }
    )


if __name__ == "__main__":
    main()
