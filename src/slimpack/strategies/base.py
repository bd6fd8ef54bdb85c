"""What every strategy is: a planner object that turns a batch of samples into a Plan.

Planners are built once per run (``make_planner``) and called once per step, so strategies that
hold samples back (WLB-LLM's outlier queues) keep their state between steps; the others are pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from slimpack.config import Config
from slimpack.plan.types import Group, PipelinePlan, Plan, Sample, Slice


class Planner(Protocol):
    name: str

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        """Plan one step. ``batch`` holds the step's new samples (ids unique across the run)."""
        ...


PlannerFactory = Callable[[Config], Planner]


def whole(sample: Sample) -> Slice:
    return Slice(sample.id, 0, sample.length)


def symmetric_pipeline(replica: int, groups: Sequence[Group], cp: int) -> PipelinePlan:
    """A pipeline on one replica whose backward groups are its forward groups (1F1B by default)."""
    groups = tuple(groups)
    return PipelinePlan(replicas=(replica,), cp=cp, forward=groups, backward=groups)


def lpt_assign(loads: Sequence[float], bins: int) -> list[int]:
    """Longest-processing-time-first: each item, heaviest first, goes to the least loaded bin
    (Graham, 1969; ties broken by the lower bin index, so results are deterministic)."""
    totals = [0.0] * bins
    owner = [0] * len(loads)
    for item in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        target = min(range(bins), key=lambda b: (totals[b], b))
        owner[item] = target
        totals[target] += loads[item]
    return owner
