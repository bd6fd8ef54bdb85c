"""``kk``: verl-style Karmarkar–Karp balancing on FLOPs, across replicas and across micro-batches.

verl (Sheng et al., EuroSys'25, "HybridFlow"; ``verl/utils/seqlen_balancing.py``) balances a batch
of variable-length sequences with the largest differencing method (``partition.karmarkar_karp``):
1. across data-parallel replicas, k = dp subsets with equal counts (its ``equal_size``);
2. inside each replica, into micro-batches: the count is the smallest that keeps every micro-batch
   within the token cap (max_context tokens), then made the same on every replica (verl takes the
   maximum over the data-parallel group, so all ranks run the same number of micro-batches);
3. micro-batches ordered with the lightest at both ends of the pipeline order
   (``packing.small_at_ends``), which shortens 1F1B warm-up and cool-down.
The weight of a sample is its training FLOPs, linear plus causal attention (``model_training_flops``
of the cost model), as in verl's workload estimate. Must not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slimpack.config import Config
from slimpack.cost import model_training_flops
from slimpack.plan.types import Group, Plan, Sample
from slimpack.strategies.base import cut_to_context, symmetric_plan, whole
from slimpack.strategies.packing import Bins, fewest_bins, small_at_ends
from slimpack.strategies.partition import karmarkar_karp


def balanced_micro_batches(lengths: list[int], flops: list[float], k: int, cap: int) -> Bins | None:
    """KK into min(k, items) non-empty micro-batches, or None if one exceeds ``cap`` tokens."""
    parts = [p for p in karmarkar_karp(flops, min(k, len(lengths))) if p]
    return parts if all(sum(lengths[i] for i in p) <= cap for p in parts) else None


class KKPlanner:
    name = "kk"

    def __init__(self, config: Config) -> None:
        self.config = config

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        cap = self.config.train.max_context
        samples = cut_to_context(batch, cap)
        flops = [model_training_flops(self.config.model, s.length) for s in samples]
        replicas = karmarkar_karp(flops, self.config.parallel.dp, equal_count=True)
        lengths = [[samples[i].length for i in r] for r in replicas]
        weights = [[flops[i] for i in r] for r in replicas]
        # the smallest count each replica needs on its own, then the largest of those for all
        need = [len(fewest_bins(lambda k, r=r: balanced_micro_batches(lengths[r], weights[r], k, cap),
                                lengths[r], cap, math.ceil(sum(lengths[r]) / cap)))
                for r in range(len(replicas)) if replicas[r]]
        count = max(need, default=0)
        while True:
            parts = [balanced_micro_batches(lengths[r], weights[r], count, cap) if replicas[r] else []
                     for r in range(len(replicas))]
            if all(p is not None for p in parts):
                break
            count += 1
        per_replica: list[list[Group]] = []
        for r, micro_batches in enumerate(parts):
            assert micro_batches is not None
            load = [sum(weights[r][i] for i in mb) for mb in micro_batches]
            per_replica.append([tuple(whole(samples[replicas[r][i]]) for i in micro_batches[j])
                                for j in small_at_ends(load)])
        return symmetric_plan(self.config, self.name, step, samples, per_replica,
                              {"micro_batches_per_replica": count})
