"""A job's progress: waiting for its status (or any condition), its loss and log events."""

from __future__ import annotations

import time


def wait_for(job, statuses=("succeeded", "failed", "cancelled"), timeout: float = 180, until=None):
    """``job`` (any model with a status) once it is in one of ``statuses``, or once
    ``until(job)`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        job.refresh_from_db()
        if until(job) if until else job.status in statuses:
            return job
        assert time.monotonic() < deadline, (
            f"job {job.pk} is {job.status} ({job.phase}) after {timeout} s: {job.error}"
        )
        time.sleep(0.3)


def losses(job) -> dict[int, float]:
    """The job's training loss by step, as its runner reported it."""
    return {e.data["step"]: e.data["loss"] for e in job.events.filter(kind="loss")}


def log_of(job) -> str:
    """The job's log lines (its runner's output and the worker's notes), one text."""
    return "\n".join(e.data["message"] for e in job.events.filter(kind="log"))
