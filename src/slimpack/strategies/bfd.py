"""``bfd``: best-fit-decreasing packing to the context length, what TRL's ``pack_dataset`` does.

Documents sorted longest first each go into the fullest bin (packed sequence) that still has room
for them, a new bin when none has (``packing.best_fit_decreasing``); documents longer than the
context are first cut into context-length chunks. One bin is one micro-batch. Bins are spread over
the data-parallel replicas by token count, longest-processing-time first (``lpt_assign``), and run
1F1B in the order they were opened. Packing balances tokens, not time: that is the baseline's point.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slimpack.config import Config
from slimpack.plan.types import Group, Plan, Sample
from slimpack.strategies.base import cut_to_context, lpt_assign, symmetric_plan, whole
from slimpack.strategies.packing import best_fit_decreasing


class BFDPlanner:
    name = "bfd"

    def __init__(self, config: Config) -> None:
        self.config = config

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        packed = self.pack(batch)
        per_replica = [packed.groups(r) for r in range(self.config.parallel.dp)]
        return symmetric_plan(self.config, self.name, step, packed.samples, per_replica, packed.info)

    def pack(self, batch: Sequence[Sample]) -> Packed:
        """The bins of ``batch`` and their replicas, before any slice is made: SlimPack's planner
        builds the pipelines of this plan one at a time (``candidates.reference_candidate``)."""
        train = self.config.train
        capacity = train.micro_batch_cap
        samples = cut_to_context(batch, train.max_context)
        bins = best_fit_decreasing([s.length for s in samples], capacity)
        tokens = [sum(samples[i].length for i in b) for b in bins]
        owner = lpt_assign(tokens, self.config.parallel.dp)
        per_replica: list[list[list[int]]] = [[] for _ in range(self.config.parallel.dp)]
        for b, items in enumerate(bins):
            per_replica[owner[b]].append(items)
        return Packed(samples, per_replica,
                      {"num_bins": len(bins), "fill": sum(tokens) / (len(bins) * capacity) if bins else 0.0})


@dataclass(frozen=True, slots=True)
class Packed:
    """``BFDPlanner.pack``'s result: the samples, each replica's bins (indices into them, in
    order) and the plan's info."""

    samples: list[Sample]
    bins: list[list[list[int]]]
    info: dict

    def groups(self, replica: int) -> list[Group]:
        return [tuple(whole(self.samples[i]) for i in items) for items in self.bins[replica]]

    def tokens(self, replica: int) -> int:
        return sum(self.samples[i].length for items in self.bins[replica] for i in items)
