"""The Plan: which slices run together, in which order, on which pipeline. Frozen values only.

Semantics (DESIGN.md §3): a *slice* ``(sample_id, start, end)`` is the token range [start, end) of a
sample; its attention covers keys [0, end) of that sample. A *group* is an ordered tuple of slices
run as one unit on a stage. Each pipeline has forward groups and backward groups that partition the
same slices; ``order`` gives each stage's action sequence, always set inside a ``Plan`` (a planner
or plan file that leaves it out gets the default schedule, resolved once when the plan is made).
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, Literal, NamedTuple

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.schedule.actions import Action, Order
from slimpack.schedule.default import default_order

__all__ = ["Action", "Formation", "Group", "PipelinePlan", "Plan", "Run", "Sample", "Slice", "group_tokens", "runs",
           "with_default_orders"]


class Slice(NamedTuple):
    sample_id: int
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


Group = tuple[Slice, ...]


def group_tokens(group: Sequence[Slice]) -> int:
    """Tokens of a group's slices (Σ end − Σ start: two sums in C, for planners' hot loops)."""
    return sum(map(itemgetter(2), group)) - sum(map(itemgetter(1), group))


Run = Slice
"""Consecutive slices of one sample run next to each other, as the one slice they span: one
attention segment (one varlen entry, one kernel tile schedule) over queries [start, end) with keys
[0, end)."""


def runs(group: Sequence[Slice]) -> list[Run]:
    """The attention segments of slices in the order given: a slice that continues the previous
    one ([a, b) then [b, c) of one sample) extends its run."""
    out: list[Run] = []
    for s in group:
        if out and s.sample_id == out[-1].sample_id and s.start == out[-1].end:
            out[-1] = Slice(s.sample_id, out[-1].start, s.end)
        else:
            out.append(Slice(s.sample_id, s.start, s.end))
    return out


Formation = Literal["slim", "mix", "pack"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    id: int
    """Unique within a plan (and across the steps of one run)."""
    length: int
    """Tokens."""
    arrival_step: int = 0
    """Step at which the sample entered the batch stream (for the delay of deferred samples)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    replicas: tuple[int, ...]
    """DP replica indices running this pipeline: one, or several merged into a CP group."""
    cp: int
    """Context-parallel degree of this pipeline (layout cp x number of merged replicas)."""
    forward: tuple[Group, ...]
    """Forward groups in execution order."""
    backward: tuple[Group, ...]
    """Backward groups in execution order (a partition of the same slices)."""
    order: Order | None = None
    """Per stage, the action sequence. None only before the pipeline is put in a ``Plan``, which
    replaces it with the default schedule for these groups (``schedule.default_order``)."""
    formations: tuple[Formation, ...] | None = None
    """Per forward group, how it was formed (SlimPack reports slim/mix/pack)."""

    @property
    def symmetric(self) -> bool:
        return self.forward == self.backward


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    config: Config
    strategy: str
    step: int = 0
    samples: tuple[Sample, ...]
    deferred: tuple[int, ...] = ()
    """Ids of samples of this batch held back to a later step (they appear in no group)."""
    pipelines: tuple[PipelinePlan, ...]
    info: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Planner diagnostics (time taken, solver status, chosen knobs); not needed to check or run.
    Built once, with the plan (``dataclasses.replace(plan, info=...)`` for an addition)."""

    def __post_init__(self) -> None:
        # a plan carries its schedule: every pipeline's order is resolved once, here, so nothing
        # that reads the plan (checker, simulator, runtime) needs a cost model to know what runs when
        if any(pipe.order is None for pipe in self.pipelines):
            object.__setattr__(self, "pipelines", with_default_orders(self.pipelines, self.config))

    def sample_lengths(self) -> dict[int, int]:
        return {s.id: s.length for s in self.samples}

    @property
    def trained_samples(self) -> tuple[Sample, ...]:
        """The samples this step trains: all of ``samples`` but the deferred ones."""
        deferred = set(self.deferred)
        return tuple(s for s in self.samples if s.id not in deferred)


def with_default_orders(pipelines: Sequence[PipelinePlan], config: Config) -> tuple[PipelinePlan, ...]:
    """``pipelines`` with each missing order replaced by the default schedule, whose memory cap comes
    from the cost model of ``config`` (the plan's own config, so a plan file resolves alone)."""
    cost = CostModel(config)
    return tuple(pipe if pipe.order is not None else replace(pipe, order=default_order(
        pipe.forward, pipe.backward, cp=pipe.cp, config=config, cost=cost, where=f"pipelines[{p}]"))
        for p, pipe in enumerate(pipelines))
