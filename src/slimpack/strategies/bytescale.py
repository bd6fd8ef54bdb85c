"""``bytescale``: ByteScale's FLOP-balanced buckets (Ge et al., 2025, "ByteScale: Efficient Scaling of
LLM Training with a 2048K Context Length on More Than 12,000 GPUs", arXiv 2502.21231, §5 balance).

The batch is sorted by length (longest first) and cut into dp contiguous buckets of about equal
training FLOPs (``packing.contiguous_cuts``; FLOPs = linear + causal attention, the cost model's
``model_training_flops``), one bucket per replica, so each pipeline sees sequences of similar length.
Inside a replica the sequences are packed into the fewest micro-batches that keep every one within
the token cap (max_context), placed longest first into the micro-batch of least FLOPs
(``packing.least_loaded_fit``). A replica holding long sequences has fewer tokens for the same
FLOPs, hence fewer micro-batches. ByteScale's data-aware sharding (running long sequences over more
ranks with dynamic communication) is left out. Must not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from slimpack.config import Config
from slimpack.cost import model_training_flops
from slimpack.plan.types import Group, Plan, Sample
from slimpack.strategies.base import cut_to_context, symmetric_plan, whole
from slimpack.strategies.packing import Bins, contiguous_cuts, least_loaded_fit, smallest_count


def pack_capped(lengths: list[int], weights: list[float], k: int, cap: int) -> Bins | None:
    """Items (already longest first) into ``k`` micro-batches of least weight under ``cap`` tokens;
    None if some item finds no room."""
    bins, left = least_loaded_fit(range(len(lengths)), lengths, weights, k, cap)
    return None if left else [b for b in bins if b]


class ByteScalePlanner:
    name = "bytescale"

    def __init__(self, config: Config) -> None:
        self.config = config

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        cap = self.config.train.micro_batch_cap
        samples = sorted(cut_to_context(batch, self.config.train.max_context), key=lambda s: (-s.length, s.id))
        # in one numpy call: the same arithmetic, bit for bit, as one call per sample
        flops = model_training_flops(self.config.model, np.array([s.length for s in samples], dtype=np.int64)).tolist()
        per_replica: list[list[Group]] = []
        counts = []
        for bucket in contiguous_cuts(flops, self.config.parallel.dp):
            lengths = [samples[i].length for i in bucket]
            weights = [flops[i] for i in bucket]
            micro_batches = smallest_count(lambda k, n=lengths, w=weights: pack_capped(n, w, k, cap),
                                           math.ceil(sum(lengths) / cap), len(lengths)) if lengths else []
            per_replica.append([tuple(whole(samples[bucket[j]]) for j in mb) for mb in micro_batches])
            counts.append(len(micro_batches))
        return symmetric_plan(self.config, self.name, step, samples, per_replica,
                              {"micro_batches_per_replica": counts})
