"""``fixed``: Megatron-LM fixed-length packing, the baseline every user knows.

Documents, in data order, are concatenated into one token stream that is cut into sequences of
exactly ``max_context`` tokens (the last one may be shorter). A document that straddles a cut is
split there and its two parts become separate samples, as in Megatron's GPT dataset: the second
part does not attend to the first (document boundaries inside a sequence are kept for masking).
A micro-batch is ``micro_batch_cap // max_context`` consecutive sequences (Megatron's micro-batch
size: one by default, more with ``micro_batch_tokens``); micro-batches are dealt round-robin over the
DP replicas;
forward and backward groupings are identical and run 1F1B (Narayanan et al., SC'21).
"""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.config import Config
from slimpack.plan.types import Plan, Sample, Slice
from slimpack.strategies.base import symmetric_plan


def pack_fixed_length(batch: Sequence[Sample], context: int) -> tuple[list[Sample], list[list[Slice]]]:
    """Cut the concatenated stream into ``context``-token sequences. Returns the samples as they
    end up (straddling documents split into new samples with fresh ids) and the sequences."""
    next_id = max((s.id for s in batch), default=-1) + 1
    samples: list[Sample] = []
    sequences: list[list[Slice]] = [[]]
    room = context
    for sample in batch:
        remaining, sid = sample.length, sample.id
        while remaining:
            if room == 0:
                sequences.append([])
                room = context
            take = min(room, remaining)
            samples.append(Sample(id=sid, length=take, arrival_step=sample.arrival_step))
            sequences[-1].append(Slice(sid, 0, take))
            room -= take
            remaining -= take
            if remaining:
                sid, next_id = next_id, next_id + 1
    return samples, [seq for seq in sequences if seq]


class FixedPlanner:
    name = "fixed"

    def __init__(self, config: Config) -> None:
        self.config = config

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        par, train = self.config.parallel, self.config.train
        samples, sequences = pack_fixed_length(batch, train.max_context)
        size = train.micro_batch_cap // train.max_context
        per_replica: list[list[tuple[Slice, ...]]] = [[] for _ in range(par.dp)]
        for k, first in enumerate(range(0, len(sequences), size)):
            per_replica[k % par.dp].append(tuple(piece for seq in sequences[first:first + size] for piece in seq))
        return symmetric_plan(self.config, self.name, step, samples, per_replica,
                              {"num_sequences": len(sequences), "split_documents": len(samples) - len(batch)})
