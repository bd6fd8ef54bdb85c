"""``slimpipe``: SlimPipe (Li et al., 2025, "SlimPipe: Memory-Thrifty and Efficient Pipeline
Parallelism for Long-Context LLM Training", arXiv 2504.14519).

Megatron's fixed-length packed sequences (``fixed.pack_fixed_length``, dealt round-robin over the
replicas) are each cut into ``n`` slices of equal training cost (forward + backward, from the cost
model) at ``slice_align`` boundaries, and the pipeline runs 1F1B at slice granularity: a sequence's forward slices in order, its backward slices in reverse, so
the last stage runs every forward slice of a sequence before the first of its backwards. In a Plan
that is forward groups = the slices in order and backward groups = the same slices with each
sequence's slices reversed, run by SlimPipe's slice-level 1F1B (``schedule.builders.slice_1f1b``): stage s runs
n + pp - 1 - s forward slices before its first backward, then alternates one backward and one
forward, so a stage holds the activations of at most (n + pp - 1)/n sequences instead of pp. Slicing shrinks the activation memory of one unit by n and the warm-up bubble with it.
``n`` is chosen per step by simulating each candidate (up to 32 slices) and keeping the fastest that
fits in memory (the one with the least peak memory if none fits).
SlimPipe evens out causal attention (later slices attend to more keys) by exchanging attention
context between pipeline ranks; a plan cannot express that exchange, so cost-balanced slices stand
in for what it achieves: every slice of a sequence takes about the same time. Must not import torch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.errors import UserError
from slimpack.plan.types import Group, PipelinePlan, Plan, Sample, Slice
from slimpack.schedule.actions import slice_columns
from slimpack.schedule.builders import slice_1f1b
from slimpack.sim import step_and_peak
from slimpack.strategies.fixed import pack_fixed_length

NUM_SLICES = (1, 2, 4, 8, 16, 32)

SliceCost = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""Cost of slices given their tokens and prefixes (numpy arrays in, an array out)."""


def cumulative_cost(lengths: np.ndarray, starts: np.ndarray, positions: np.ndarray, cost: SliceCost) -> np.ndarray:
    """Cost of the first ``positions[i]`` tokens of a packed sequence of documents (each piece's
    ``lengths`` and ``starts``, float): the whole documents before the position plus the piece of
    the one it falls in (that piece starts at the document's offset)."""
    ends = np.cumsum(lengths)
    whole = np.concatenate([[0.0], np.cumsum(cost(lengths, starts))])
    inside = np.searchsorted(ends, positions, side="right")  # the document each position falls in
    inside_clipped = np.minimum(inside, len(lengths) - 1)
    offset = positions - (ends[inside_clipped] - lengths[inside_clipped])
    partial = np.where((inside < len(lengths)) & (offset > 0),
                       cost(np.maximum(offset, 1.0), starts[inside_clipped]), 0.0)
    return whole[inside] + partial


class CostProfile(NamedTuple):
    """A packed sequence's pieces (token counts, read once) and, where slices balance cost, the
    cost reached at each aligned position: every slice count cuts the same profile."""

    tokens: list[int]
    positions: np.ndarray | None = None
    reached: np.ndarray | None = None


def cost_profile(sequence: Sequence[Slice], align: int, cost: SliceCost | None = None) -> CostProfile:
    """The ``CostProfile`` of ``sequence`` (without ``cost``: its tokens only)."""
    # the pieces read in C once: every candidate slice count cuts every sequence of the batch
    _, starts, stops = slice_columns(sequence, len(sequence))
    lengths = stops - starts
    tokens = lengths.tolist()
    if cost is None:
        return CostProfile(tokens)
    total = sum(tokens)
    positions = np.arange(0, total + align, align, dtype=np.float64).clip(max=total)
    return CostProfile(tokens, positions,
                       cumulative_cost(lengths.astype(np.float64), starts.astype(np.float64), positions, cost))


def slice_sequence(sequence: Sequence[Slice], n: int, align: int, cost: SliceCost | None = None, *,
                   profile: CostProfile | None = None) -> list[Group]:
    """Cut a packed sequence of whole documents into ``n`` chunks, boundaries on multiples of
    ``align``: of about equal ``cost`` (equal tokens without one); each chunk is the group of document
    pieces inside it (fewer than ``n`` chunks when the sequence is too short to cut that finely).
    ``profile``: the sequence's ``cost_profile`` with that ``align`` and ``cost``, when known."""
    if profile is None:
        profile = cost_profile(sequence, align, cost if n > 1 else None)
    tokens = profile.tokens
    total = sum(tokens)
    if cost is None or n == 1:
        cuts = sorted({0, total, *(min(total, round(j * total / n / align) * align) for j in range(1, n))})
    else:
        positions, reached = profile.positions, profile.reached
        targets = reached[-1] * np.arange(1, n) / n
        picks = np.searchsorted(reached, targets)  # first aligned position at or past each target
        nearer = np.where(picks > 0, np.abs(reached[np.maximum(picks - 1, 0)] - targets) < np.abs(reached[picks] - targets), False)
        cuts = sorted({0, total, *(int(positions[p - 1 if back else p]) for p, back in zip(picks, nearer, strict=True))})
    offsets = [0, *accumulate(tokens)]  # where each document starts in the sequence
    groups: list[Group] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        first, last = bisect_right(offsets, a) - 1, bisect_left(offsets, b) - 1  # the documents [a, b) meets
        if first == last:
            groups.append((_piece(sequence[first], offsets[first], a, b),))
        else:  # the documents between the two ends are whole: their slices as they are (none is empty)
            groups.append((_piece(sequence[first], offsets[first], a, b), *sequence[first + 1:last],
                           _piece(sequence[last], offsets[last], a, b)))
    return groups


def _piece(document: Slice, offset: int, a: int, b: int) -> Slice:
    """The part of ``document`` (which starts at ``offset`` in its sequence) inside [a, b)."""
    lo, hi = max(a, offset), min(b, offset + document.end - document.start)
    return Slice(document.sample_id, document.start + lo - offset, document.start + hi - offset)


class SlimPipePlanner:
    name = "slimpipe"

    def __init__(self, config: Config, *, num_slices: Sequence[int] = NUM_SLICES) -> None:
        if config.parallel.virtual_stages > 1:
            raise UserError("slimpipe: its slice-level 1F1B runs without interleaved stages; got "
                            f"{config.parallel.virtual_stages} virtual stages (use --vpp 1)")
        self.config = config
        self.cost = CostModel(config)
        context, shortest = config.train.max_context, config.planner.min_slice_tokens
        # slices shorter than the planner's minimum run kernels far below peak: not worth trying
        self.candidates = tuple(n for n in num_slices if n == 1 or context // n >= shortest) or (1,)
        forward, backward = (self.cost.slice_cost_function(backward=b) for b in (False, True))
        self.slice_cost: SliceCost = lambda tokens, prefix: forward(tokens, prefix) + backward(tokens, prefix)
        self._profiles: dict[int, tuple[Sequence[Slice], CostProfile]] = {}

    def build(self, samples: Sequence[Sample], sequences: Sequence[Sequence[Slice]], n: int, step: int) -> Plan:
        """The plan of ``sequences`` (dealt round-robin over the replicas) at ``n`` slices."""
        dp = self.config.parallel.dp
        pipelines = [self.pipeline(sequences[replica::dp], replica, n) for replica in range(dp)]
        return self.assemble(samples, pipelines, n, step)

    def assemble(self, samples: Sequence[Sample], pipelines: Sequence[PipelinePlan], n: int, step: int) -> Plan:
        """The plan of ``pipelines`` (one per replica, in replica order) at ``n`` slices."""
        return Plan(config=self.config, strategy=self.name, step=step, samples=tuple(samples),
                    pipelines=tuple(pipelines), info={"num_slices": n})

    def pipeline(self, sequences: Sequence[Sequence[Slice]], replica: int, n: int) -> PipelinePlan:
        """Replica ``replica``'s pipeline: its ``sequences``, each cut into ``n`` slices."""
        par = self.config.parallel
        align = self.config.planner.slice_align
        chunks = [slice_sequence(seq, n, align, self.slice_cost, profile=self._profile(seq) if n > 1 else None)
                  for seq in sequences]
        forward = tuple(g for seq in chunks for g in seq)
        backward = tuple(g for seq in chunks for g in reversed(seq))
        pipe = PipelinePlan(replicas=(replica,), cp=par.cp, forward=forward, backward=backward)
        return replace(pipe, order=slice_1f1b(len(forward), par.pp, n))  # n = 1: plain 1F1B

    def _profile(self, sequence: Sequence[Slice]) -> CostProfile:
        """``sequence``'s cost profile, computed once per sequence object (the memo keeps the
        sequence, so its id is not reused while the profile is kept; callers do not change a
        sequence once made). Cleared at each ``plan``."""
        kept = self._profiles.get(id(sequence))
        if kept is None:
            kept = self._profiles[id(sequence)] = sequence, cost_profile(
                sequence, self.config.planner.slice_align, self.slice_cost)
        return kept[1]

    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        self._profiles.clear()
        samples, sequences = pack_fixed_length(batch, self.config.train.max_context)
        scored = []
        for n in self.candidates:
            plan = self.build(samples, sequences, n, step)
            if len(self.candidates) == 1:
                return plan
            # the simulator's step and highest peak, bit for bit, without the spans and figures
            step_s, peak = step_and_peak(plan, self.cost)
            fits = peak <= self.config.cluster.usable_memory_bytes
            scored.append(((not fits, step_s if fits else peak, n), plan, step_s))
        _, best, _ = min(scored, key=lambda t: t[0])
        return replace(best, info={**best.info,
                                   "candidates_step_time_s": {key[2]: time for key, _, time in scored}})
