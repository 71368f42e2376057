"""The team's landing page (the dashboard): what the apps tell a team there, without console
importing them. Each app registers, in its AppConfig.ready(), the steps of the chain it owns;
they come in INSTALLED_APPS order, which is the chain's (data, labels, training, serving).

A new team sees the steps as a guide, each with its page and whether the team has done it,
until its first endpoint serves.
"""

from collections.abc import Callable
from dataclasses import dataclass

from console.models import Team


@dataclass(frozen=True)
class Step:
    name: str  # stable, for tests and styles
    label: str
    help: str
    url: str
    done: bool
    # The chain is complete once the last step is done (a team that skips an optional step,
    # labeling data that came labeled, still finishes).
    optional: bool = False


first_steps: list[Callable[[Team], list[Step]]] = []


def first_run(team: Team) -> list[Step]:
    """The guide's steps, or none once the last one is done."""
    steps = [step for provider in first_steps for step in provider(team)]
    if not steps or steps[-1].done:
        return []
    return steps


def next_step(steps: list[Step]) -> Step | None:
    """The first step not done that is not optional, else the first not done."""
    todo = [s for s in steps if not s.done]
    return next((s for s in todo if not s.optional), todo[0] if todo else None)
