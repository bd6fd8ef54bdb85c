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
from slimpack.strategies.karmarkar_karp import karmarkar_karp
from slimpack.strategies.packing import Bins, small_at_ends, smallest_count


class KKPlanner:
    name = "kk"

    def __init__(self, config: Config) -> None:
        self.config = config

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        cap = self.config.train.micro_batch_cap
        samples = cut_to_context(batch, self.config.train.max_context)
        flops = [model_training_flops(self.config.model, s.length) for s in samples]
        replicas = karmarkar_karp(flops, self.config.parallel.dp, equal_count=True)
        lengths = [[samples[i].length for i in r] for r in replicas]
        weights = [[flops[i] for i in r] for r in replicas]
        # the smallest count at which every replica's micro-batches fit the cap, the same on all
        counts = [math.ceil(sum(n) / cap) for n in lengths]
        parts = smallest_count(lambda k: self._micro_batches(lengths, weights, k, cap),
                               max(counts, default=0), max(map(len, lengths), default=0))
        per_replica: list[list[Group]] = []
        for r, micro_batches in enumerate(parts):
            load = [sum(weights[r][i] for i in mb) for mb in micro_batches]
            per_replica.append([tuple(whole(samples[replicas[r][i]]) for i in micro_batches[j])
                                for j in small_at_ends(load)])
        return symmetric_plan(self.config, self.name, step, samples, per_replica,
                              {"micro_batches_per_replica": [len(p) for p in parts]})

    @staticmethod
    def _micro_batches(lengths: list[list[int]], weights: list[list[float]], k: int, cap: int) -> list[Bins] | None:
        """Every replica's KK micro-batches (min(k, its samples) of them), or None if one exceeds the cap."""
        parts = []
        for n, w in zip(lengths, weights, strict=True):
            mine = [p for p in karmarkar_karp(w, min(k, len(n))) if p] if n else []
            if any(sum(n[i] for i in p) > cap for p in mine):
                return None
            parts.append(mine)
        return parts
