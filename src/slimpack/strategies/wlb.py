"""``wlb``: WLB-LLM (Wang et al., OSDI'25, "WLB-LLM: Workload-Balanced 4D Parallelism for Large
Language Model Training", arXiv 2503.17924).

Per step:
1. **Outlier delay** (§4.2): documents at least ``outlier_lengths[i]`` long (the largest such i) wait
   in queue i; a queue that holds one document per micro-batch releases that many (oldest first),
   so the step that gets them gives every micro-batch one outlier. A call with an empty batch means
   the stream has ended and releases every queue.
2. **Var-length packing** (§4.1, Algorithm 1): the documents to pack (left-overs of the previous
   step, the new non-outliers and any released outliers) sorted longest first each go to
   the micro-batch of least predicted latency if it has room under ``s_max`` tokens, else to the one
   of fewest tokens if that has room, else wait for the next step (``packing.least_loaded_fit``).
   Predicted latency is the cost model's forward + backward time of a middle stage (linear and
   attention terms). The number of micro-batches is fixed per step: the new tokens of the step
   (plus left-overs) over ``tokens_per_micro_batch`` per micro-batch, rounded up (under
   interleaving, to a multiple of pp per replica), the same on every replica; micro-batches go to
   replicas in equal numbers balanced on latency (Karmarkar–Karp).
3. **CP sharding** (§5), when cp > 1: per micro-batch, the predicted time of per-document sharding
   (every document split over the cp ranks: the cost model's own CP semantics) against per-sequence
   sharding (the packed sequence cut into 2·cp chunks, rank r holding chunks r and 2cp-1-r); the
   faster is recorded in ``info["cp_sharding"]``. A Plan cannot say which sharding a group uses, so
   the simulator charges every group as per-document sharded (see docs/strategies.md).
Delayed and left-over samples are the plan's ``deferred``; the planner keeps them and puts them back
in a later step's ``samples`` with their original ``arrival_step``. Must not import torch.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.errors import UserError
from slimpack.plan.types import Group, Plan, Sample
from slimpack.strategies.base import symmetric_plan, whole
from slimpack.strategies.karmarkar_karp import karmarkar_karp
from slimpack.strategies.micro_batches import memory_token_cap
from slimpack.strategies.packing import least_loaded_fit

OUTLIER_MULTIPLES = (1.0, 2.0)
"""Default queue levels: a document is an outlier of level i when it alone costs at least this many
times a micro-batch of short documents (``REFERENCE_DOC_TOKENS`` each) with the same token count."""
REFERENCE_DOC_TOKENS = 1024


def sequence_shards(lengths: Sequence[int], cp: int) -> list[tuple[list[int], list[int]]]:
    """Per-sequence CP sharding of a packed sequence (Megatron-LM's load-balanced layout): 2·cp equal
    chunks, rank r holding chunks r and 2cp-1-r. Per rank, the (tokens, prefix) of its document
    pieces; a piece's prefix is where it starts in its document (its attention looks back that far)."""
    total = sum(lengths)
    bounds = [total * j // (2 * cp) for j in range(2 * cp + 1)]
    sizes = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    shards = []
    for rank in range(cp):
        tokens, prefix = [], []
        for chunk in (rank, 2 * cp - 1 - rank):
            lo, hi = np.maximum(starts, bounds[chunk]), np.minimum(ends, bounds[chunk + 1])
            held = lo < hi  # the documents this chunk holds a piece of, in order
            tokens += (hi - lo)[held].tolist()
            prefix += (lo - starts)[held].tolist()
        shards.append((tokens, prefix))
    return shards


class WLBPlanner:
    name = "wlb"
    stateful = True
    """Its outlier queues carry samples from step to step: planning step I alone replays 0..I-1."""

    def __init__(self, config: Config, *, s_max: int | None = None,
                 outlier_lengths: Sequence[int] | None = None,
                 tokens_per_micro_batch: int | None = None) -> None:
        self.config = config
        self.cost = CostModel(config)
        cap = config.train.micro_batch_cap
        align = config.planner.slice_align
        # a micro-batch must at least take one context-length document (and the cap the user set),
        # whatever memory says
        self.s_max = s_max or max(cap, memory_token_cap(self.cost) // align * align)
        self.tokens_per_micro_batch = tokens_per_micro_batch or cap
        if outlier_lengths is None:
            outlier_lengths = self._default_outlier_lengths()
        self.outlier_lengths = tuple(sorted(outlier_lengths))
        self.queues: list[list[Sample]] = [[] for _ in self.outlier_lengths]
        self.carry: list[Sample] = []

    def state_dict(self) -> dict[str, Any]:
        """The samples it holds (queues and left-overs) as ``[id, length, arrival_step]`` lists."""
        def rows(samples: Sequence[Sample]) -> list[list[int]]:
            return [[s.id, s.length, s.arrival_step] for s in samples]
        return {"queues": [rows(queue) for queue in self.queues], "carry": rows(self.carry)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["queues"]) != len(self.queues):
            raise UserError(f"wlb state has {len(state['queues'])} queues; this config makes "
                            f"{len(self.queues)} (outlier lengths {list(self.outlier_lengths)})")
        def samples(rows: Sequence[Sequence[int]]) -> list[Sample]:
            return [Sample(id=i, length=n, arrival_step=a) for i, n, a in rows]
        self.queues = [samples(rows) for rows in state["queues"]]
        self.carry = samples(state["carry"])

    def latency(self, lengths: Sequence[int]) -> np.ndarray:
        """Predicted forward + backward seconds of whole documents on a middle stage."""
        zeros = np.zeros(len(lengths))
        return (self.cost.slice_costs(lengths, zeros, backward=False)
                + self.cost.slice_costs(lengths, zeros, backward=True))

    def _default_outlier_lengths(self) -> list[int]:
        align = self.config.planner.slice_align
        grid = np.arange(align, self.config.train.max_context + 1, align)
        cost = self.latency(grid)
        reference = self.tokens_per_micro_batch / REFERENCE_DOC_TOKENS * self.latency([REFERENCE_DOC_TOKENS])[0]
        found = np.searchsorted(cost, [m * reference for m in OUTLIER_MULTIPLES])  # cost rises with length
        return sorted({int(grid[i]) for i in found if i < len(grid)})

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        context = self.config.train.max_context
        for s in batch:
            if s.length > context:
                raise UserError(f"wlb: sample {s.id} has {s.length} tokens, above max_context={context}; "
                                "cut documents to the context before planning (the data sampler does)")
        dp = self.config.parallel.dp
        previous = [s for queue in self.queues for s in queue] + self.carry
        pack, num_micro_batches = self._gather(batch)
        lengths = [s.length for s in pack]
        weights = self.latency(lengths)
        # longest first, then by id (sorted in numpy: ids are unique, so the order is the same)
        order = np.lexsort((np.array([s.id for s in pack], dtype=np.int64), -np.array(lengths, dtype=np.int64))).tolist()
        bins, left = least_loaded_fit(order, lengths, weights.tolist(), num_micro_batches, self.s_max)
        self.carry = [pack[i] for i in left]
        bins = [b for b in bins if b]
        owner = karmarkar_karp([float(weights[b].sum()) for b in bins], dp, equal_count=True)
        per_replica: list[list[Group]] = [[tuple(whole(pack[i]) for i in bins[j]) for j in mine] for mine in owner]
        deferred = [s.id for s in self.carry] + [s.id for queue in self.queues for s in queue]
        held = set(deferred)
        scheduled = [s for s in pack if s.id not in held]
        info = {"s_max": self.s_max, "outlier_lengths": list(self.outlier_lengths),
                "micro_batches": num_micro_batches, "queued": [len(q) for q in self.queues],
                "max_delay_steps": max((step - s.arrival_step for s in scheduled), default=0)}
        if self.config.parallel.cp > 1:
            info["cp_sharding"] = [[self._cp_choice(g) for g in groups] for groups in per_replica]
        return symmetric_plan(self.config, self.name, step, previous + list(batch), per_replica, info, deferred)

    def _gather(self, batch: Sequence[Sample]) -> tuple[list[Sample], int]:
        """Route the new outliers to their queues and open the full ones (all of them once the
        stream has ended). Returns what to pack and the micro-batch count."""
        dp = self.config.parallel.dp
        pack = list(self.carry)
        nominal = sum(s.length for s in pack) + sum(s.length for s in batch)
        if not batch:  # the stream has ended: nothing will come to fill the queues
            nominal += sum(s.length for queue in self.queues for s in queue)
        for s in batch:
            level = bisect_right(self.outlier_lengths, s.length) - 1
            (self.queues[level] if level >= 0 else pack).append(s)
        per_replica = math.ceil(nominal / (dp * self.tokens_per_micro_batch))
        # WLB-LLM sets the count itself, so under interleaving it picks one Megatron's interleaved
        # 1F1B runs (rounds of pp) rather than padding it afterwards by splitting micro-batches
        rounds = self.config.parallel.pp if self.config.parallel.virtual_stages > 1 else 1
        num_micro_batches = dp * rounds * math.ceil(per_replica / rounds)
        for queue in self.queues:
            full = 0 < num_micro_batches <= len(queue)
            take = len(queue) if not batch else (num_micro_batches if full else 0)
            pack.extend(queue[:take])  # oldest first: one per micro-batch
            del queue[:take]
        if rounds > 1 and len(pack) < num_micro_batches:
            # fewer documents than micro-batches (the drain of the queues, small batches): some
            # would stay empty and the rounds of pp break, so fewer, fuller ones (when the
            # documents make at least one round on every replica)
            unit = dp * rounds
            num_micro_batches = max(unit, len(pack) // unit * unit)
        return pack, num_micro_batches

    def _cp_choice(self, group: Group) -> str:
        """``"document"`` or ``"sequence"``: the CP sharding with the lower predicted time (§5)."""
        cost, cp = self.cost, self.config.parallel.cp
        middle = (self.config.parallel.pp * self.config.parallel.virtual_stages) // 2

        def time(tokens: Sequence[int], prefix: Sequence[int], shards: int) -> float:
            return sum(cost.group_time(tokens, prefix, virtual_stage=middle, backward=b, cp=shards)
                       for b in (False, True))

        lengths = [s.tokens for s in group]
        per_document = time(lengths, [0] * len(lengths), cp)
        per_sequence = max(time(t, p, 1) for t, p in sequence_shards(lengths, cp))
        return "document" if per_document <= per_sequence else "sequence"
