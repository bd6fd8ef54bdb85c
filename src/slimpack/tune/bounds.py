"""Cheap bounds that let the search skip layouts without simulating them.

Both are *lower* bounds on what the simulator would report, so pruning by them never drops the best
layout (``tests/tune`` checks this against exhaustive simulation):

- **memory floor**: model states plus the kept activations of the batch's longest sample on a
  stage (``CostModel.sample_floor_bytes``), spread over the widest context-parallel group the
  strategy can form.
- **time floor** of a run of steps: the whole-document work of every sample, per stage, as if the
  stage ran it as one group at the layout's cp, divided over the dp replicas, plus each step's
  gradient sync and optimizer. Every cost term is superadditive over groups (per-group overhead,
  the GEMM's half-efficiency tokens, per-slice attention efficiency, ring latencies), and merging
  replicas into a wider CP group does not reduce the device-seconds, so no plan does better. For
  strategies that run each sample whole on one pipeline, a step also takes at least its longest
  sample's forward and backward through every chunk. Strategies that cut documents at sequence
  boundaries (``fixed``, ``slimpipe``) train the pieces, whose attention is less than the
  documents': their work is counted on the pieces (on the documents, fixed with 8 sequences per
  micro-batch ran up to 1% under its floor).
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from slimpack.cost import CostModel
from slimpack.plan.types import Sample
from slimpack.strategies import CUTS_DOCUMENTS
from slimpack.strategies.fixed import pack_fixed_length

WHOLE_SAMPLE_STRATEGIES = frozenset({"bfd", "kk", "bytescale"})
"""Strategies that put every sample, whole, in one group of one pipeline at the layout's cp, in the
step it arrives (``fixed`` cuts documents at sequence boundaries, ``wlb`` defers, and ``slimpack``
and ``slimpipe`` slice)."""
REPLICA_MERGING_STRATEGIES = frozenset({"slimpack"})
"""Strategies that may run one sample over all replicas merged into one context-parallel group."""


def memory_floor_bytes(cost: CostModel, longest: int, strategy: str) -> float:
    """The least peak memory any plan of ``strategy`` can have on its fullest stage."""
    par = cost.config.parallel
    return cost.sample_floor_bytes(longest, cp=par.cp * (par.dp if strategy in REPLICA_MERGING_STRATEGIES else 1))


def time_floor_s(cost: CostModel, batches: Sequence[Sequence[int]], strategy: str) -> float:
    """The least total seconds ``strategy`` can take for these steps (lengths per step)."""
    par = cost.config.parallel
    if strategy in CUTS_DOCUMENTS:
        batches = [_fixed_length_pieces(tuple(b), cost.config.train.max_context) for b in batches]
    lengths = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches if len(b)])
    per_step = [cost.grad_sync_time(s) + cost.optimizer_time(s) for s in range(par.pp)]
    work = _stage_work_s(cost, lengths)
    floor = max(work[s] / par.dp + len(batches) * per_step[s] for s in range(par.pp))
    if strategy in WHOLE_SAMPLE_STRATEGIES:
        chain = sum(_chain_s(cost, max(b)) for b in batches if len(b))
        floor = max(floor, chain + len(batches) * per_step[0])
    return floor


@lru_cache(maxsize=8)
def _fixed_length_pieces(lengths: tuple[int, ...], context: int) -> tuple[int, ...]:
    """The lengths of the pieces a fixed-length packing of one step's samples trains. Cached: ``tune``
    asks for the floor of every layout (hundreds) on the same batches, and packing a 16K-sample batch
    takes ~60 ms."""
    samples, _ = pack_fixed_length([Sample(id=i, length=int(n)) for i, n in enumerate(lengths)], context)
    return tuple(s.length for s in samples)


def _stage_work_s(cost: CostModel, lengths: np.ndarray) -> list[float]:
    """Per stage, the forward + backward seconds of all ``lengths`` as one whole-document group."""
    par = cost.config.parallel
    prefix = np.zeros(len(lengths))
    work = [0.0] * par.pp
    for chunk in range(par.pp * par.virtual_stages):
        work[chunk % par.pp] += sum(cost.group_time(lengths, prefix, virtual_stage=chunk, backward=b)
                                    for b in (False, True))
    return work


def _chain_s(cost: CostModel, length: int) -> float:
    """One sample alone: its forwards down every chunk and its backwards back up (the P2P hops
    between them, small, are left out so the floor stays a floor)."""
    chunks = cost.config.parallel.pp * cost.config.parallel.virtual_stages
    return sum(cost.group_time([length], [0.0], virtual_stage=v, backward=b)
               for v in range(chunks) for b in (False, True))
