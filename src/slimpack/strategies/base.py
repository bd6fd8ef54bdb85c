"""What every strategy is: a planner object that turns a batch of samples into a Plan.

Planners are built once per run (``make_planner``) and called once per step, so strategies that
hold samples back (WLB-LLM's outlier queues) keep their state between steps; the others are pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, Protocol

import numpy as np

from slimpack.config import Config
from slimpack.plan.types import Group, PipelinePlan, Plan, Sample, Slice, group_tokens


class Planner(Protocol):
    name: str
    """The ``--strategy`` name. A planner whose plans depend on earlier steps (samples it held
    back) also sets a class attribute ``stateful = True``."""

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


def symmetric_plan(config: Config, strategy: str, step: int, samples: Sequence[Sample],
                   per_replica: Sequence[Sequence[Group]], info: dict[str, Any],
                   deferred: Sequence[int] = ()) -> Plan:
    """A plan whose replica ``r`` runs ``per_replica[r]`` as symmetric groups (1F1B by default;
    under interleaving, their count padded to a multiple of pp: ``rounds_of``)."""
    pipelines = tuple(symmetric_replica(config, r, groups) for r, groups in enumerate(per_replica))
    return Plan(config=config, strategy=strategy, step=step, samples=tuple(samples), deferred=tuple(deferred),
                pipelines=pipelines, info=info)


def symmetric_replica(config: Config, replica: int, groups: Sequence[Group]) -> PipelinePlan:
    """Replica ``replica``'s pipeline in ``symmetric_plan`` (its order left to the plan)."""
    par = config.parallel
    return symmetric_pipeline(replica, rounds_of(groups, par.pp) if par.virtual_stages > 1 else groups, par.cp)


def rounds_of(groups: Sequence[Group], pp: int) -> list[Group]:
    """``groups`` (micro-batches of whole samples) with their count padded up to a multiple of
    ``pp``: Megatron's interleaved 1F1B runs micro-batches in rounds of pp, and the frameworks the
    baselines stand for pad their count so rather than fail (verl rounds its dynamic micro-batch
    count up to a multiple of the pipeline's micro-batch group, ``num_batches_divided_by``; a
    Megatron user picks such a count). Padding splits the micro-batch with the most tokens, of those
    holding more than one sample, into two of about equal tokens, in place (each stays within its
    token cap). Unchanged where no micro-batch can be split: the schedule then says why it cannot run."""
    out = list(groups)
    while len(out) % pp:
        splittable = [i for i, group in enumerate(out) if len(group) > 1]
        if not splittable:
            break
        i = max(splittable, key=lambda k: (group_tokens(out[k]), -k))
        before = list(accumulate(end - start for _, start, end in out[i]))  # tokens up to each slice
        cut = min(range(1, len(before)), key=lambda k: (abs(2 * before[k - 1] - before[-1]), k))
        out[i:i + 1] = [out[i][:cut], out[i][cut:]]
    return out


def cut_to_context(batch: Sequence[Sample], context: int) -> list[Sample]:
    """Documents longer than ``context`` cut into ``context``-token chunks, each a new sample (fresh
    ids above the batch's largest; chunks do not attend to each other), as the data sampler and TRL's
    packing do. Samples that fit are returned unchanged."""
    next_id = max((s.id for s in batch), default=-1) + 1
    out: list[Sample] = []
    for sample in batch:
        if sample.length <= context:
            out.append(sample)
            continue
        out.append(Sample(id=sample.id, length=context, arrival_step=sample.arrival_step))
        for start in range(context, sample.length, context):
            out.append(Sample(id=next_id, length=min(context, sample.length - start), arrival_step=sample.arrival_step))
            next_id += 1
    return out


def lpt_assign(loads: Sequence[float], bins: int, *, most_items: int | None = None) -> list[int]:
    """Longest-processing-time-first: each item, heaviest first, goes to the least loaded bin
    (Graham, 1969; ties broken by the lower bin index, so results are deterministic). The bins are a
    heap of (load, bin), so a 16K-document batch over many replicas costs O(n log bins).
    ``most_items``: no bin takes more items than this (a full bin leaves the heap), so that every bin
    gets the same count when ``len(loads)`` is ``bins * most_items``."""
    assert most_items is None or most_items * bins >= len(loads), "the bins cannot hold every item"
    heap = [(0.0, b) for b in range(bins)]
    owner = [0] * len(loads)
    held = [0] * bins
    for item in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        total, target = heap[0]
        owner[item] = target
        held[target] += 1
        if held[target] == most_items:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (total + loads[item], target))
    return owner


def members(owner: Sequence[int], bins: int) -> list[list[int]]:
    """Per bin, the items ``owner`` puts in it, in item order (one sort, not one scan per bin)."""
    owned = np.asarray(owner, dtype=np.int64)
    order = np.argsort(owned, kind="stable")
    return [part.tolist() for part in np.split(order, np.searchsorted(owned[order], np.arange(1, bins)))]
