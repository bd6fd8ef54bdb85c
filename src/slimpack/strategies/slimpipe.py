"""``slimpipe``: SlimPipe (Li et al., 2025, "SlimPipe: Memory-Thrifty and Efficient Pipeline
Parallelism for Long-Context LLM Training", arXiv 2504.14519).

Megatron's fixed-length packed sequences (``fixed.pack_fixed_length``, dealt round-robin over the
replicas) are each cut uniformly into ``n`` slices at ``slice_align`` boundaries, and the pipeline runs
1F1B at slice granularity: a sequence's forward slices in order, its backward slices in reverse, so
the last stage runs every forward slice of a sequence before the first of its backwards. In a Plan
that is forward groups = the slices in order and backward groups = the same slices with each
sequence's slices reversed, run by SlimPipe's slice-level 1F1B (``schedule.builders.slice_1f1b``): stage s runs
n + pp - 1 - s forward slices before its first backward, then alternates one backward and one
forward, so a stage holds the activations of at most (n + pp - 1)/n sequences instead of pp. Slicing shrinks the activation memory of one unit by n and the warm-up bubble with it.
``n`` is chosen per step by simulating each candidate and keeping the fastest that fits in memory
(the one with the least peak memory if none fits). SlimPipe's redistribution of attention work
between pipeline ranks (later slices attend to more keys) is left out. Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.errors import UserError
from slimpack.plan.types import Group, PipelinePlan, Plan, Sample, Slice
from slimpack.schedule.builders import slice_1f1b
from slimpack.sim import simulate
from slimpack.strategies.fixed import pack_fixed_length

NUM_SLICES = (1, 2, 4, 8)


def slice_sequence(sequence: Sequence[Slice], n: int, align: int) -> list[Group]:
    """Cut a packed sequence of whole documents into ``n`` chunks of about equal tokens, boundaries on
    multiples of ``align``; each chunk is the group of document pieces inside it (fewer than ``n``
    chunks when the sequence is too short to cut that finely)."""
    total = sum(s.tokens for s in sequence)
    cuts = sorted({0, total, *(min(total, round(j * total / n / align) * align) for j in range(1, n))})
    groups: list[Group] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        pieces, offset = [], 0
        for s in sequence:
            lo, hi = max(a, offset), min(b, offset + s.tokens)
            if lo < hi:
                pieces.append(Slice(s.sample_id, s.start + lo - offset, s.start + hi - offset))
            offset += s.tokens
        groups.append(tuple(pieces))
    return groups


class SlimPipePlanner:
    name = "slimpipe"

    def __init__(self, config: Config, *, num_slices: Sequence[int] = NUM_SLICES) -> None:
        if config.parallel.virtual_stages > 1:
            raise UserError("slimpipe: slice-level 1F1B is implemented for virtual_stages = 1, got "
                            f"{config.parallel.virtual_stages}")
        self.config = config
        self.cost = CostModel(config)
        context, shortest = config.train.max_context, config.planner.min_slice_tokens
        # slices shorter than the planner's minimum run kernels far below peak: not worth trying
        self.candidates = tuple(n for n in num_slices if n == 1 or context // n >= shortest) or (1,)

    def build(self, samples: Sequence[Sample], sequences: Sequence[Sequence[Slice]], n: int, step: int) -> Plan:
        par = self.config.parallel
        pipelines = []
        for replica in range(par.dp):
            chunks = [slice_sequence(seq, n, self.config.planner.slice_align) for seq in sequences[replica::par.dp]]
            forward = tuple(g for seq in chunks for g in seq)
            backward = tuple(g for seq in chunks for g in reversed(seq))
            pipe = PipelinePlan(replicas=(replica,), cp=par.cp, forward=forward, backward=backward)
            if n > 1:
                pipe = replace(pipe, order=slice_1f1b(len(forward), par.pp, n))
            pipelines.append(pipe)
        return Plan(config=self.config, strategy=self.name, step=step, samples=tuple(samples),
                    pipelines=tuple(pipelines), info={"num_slices": n})

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        samples, sequences = pack_fixed_length(batch, self.config.train.max_context)
        scored = []
        for n in self.candidates:
            plan = self.build(samples, sequences, n, step)
            if len(self.candidates) == 1:
                return plan
            result = simulate(plan, self.cost, check=False)
            fits = not result.oom
            scored.append(((not fits, result.step_time_s if fits else max(result.peak_memory_bytes), n),
                           plan, result.step_time_s))
        _, best, _ = min(scored, key=lambda t: t[0])
        best.info["candidates_step_time_s"] = {key[2]: time for key, _, time in scored}
        return best
