"""Every benchmark at its smoke size (``--smoke``: tiny data, one epoch, a few requests) still
runs end to end and ends with its one JSON line: benchmarks rot where nothing runs them. Their
figures are not checked here (`make bench` measures them)."""

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.helpers.system import ROOT

# Its module-scoped fixtures: the module runs whole in one process of the suite (Makefile).
pytestmark = pytest.mark.xdist_group("benchmarks")

BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").glob("[!_]*.py"))
# Run a few at a time: much of a smoke is waiting (servers starting, a job's process, a
# worker's poll), which another one's work fills.
AT_ONCE = 3


def smoke(name: str) -> subprocess.CompletedProcess:
    # Label Studio is the suite's (LABEL_STUDIO_URL); Redis is each benchmark's own
    # throwaway one, where it needs one, so that no worker of the suite takes its jobs.
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def smokes() -> dict[str, Future]:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        yield {name: pool.submit(smoke, name) for name in BENCHMARKS}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_smoke_ends_with_its_json_line(name, smokes):
    done = smokes[name].result()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    last = done.stdout.strip().splitlines()[-1]
    assert isinstance(json.loads(last), dict), last
