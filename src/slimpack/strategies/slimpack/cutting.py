"""Cut an ordered sequence of slices into groups of (nearly) equal cost, slicing where it pays.

The planner lays a pipeline's samples out as one sequence and cuts it into K contiguous groups:
group g closes when its cost reaches the remaining cost divided by the groups still to form. A
sample that straddles a cut is sliced there (SlimPack's slicing: the cut is placed by cost, so the
equal-cost slices of a long sample shrink towards its attention-heavy end), provided both pieces are
at least ``min_slice`` tokens and the cut is aligned to the attention tile; otherwise the sample
stays whole and goes to whichever side leaves the group closer to its budget.
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import accumulate
from operator import itemgetter, sub

import numpy as np

from slimpack.plan.types import Slice, group_tokens
from slimpack.schedule.actions import slice_columns

SliceCost = Callable[[float, float], float]
"""cost(tokens, prefix) of a slice; increasing in tokens."""


@dataclass(frozen=True, slots=True)
class CutRules:
    can_cut: bool
    """Whether samples may be cut at all (the ``--no-slicing`` ablation turns this off)."""
    min_slice: int
    """Shortest piece a cut may leave on either side."""
    align: int
    """Cut positions are multiples of this (within the sample)."""
    max_linked_tokens: float = math.inf
    """The most tokens a run of groups linked by cut samples may hold. A group holding the last
    slice of one cut sample and the first of another links their chains: the backward of every
    group in the run waits for the forward of the run's last group, so a stage holds all of the
    run's activations at once. A new sample is not cut where that would pass this."""


def best_cut(piece: Slice, need: float, cost: SliceCost, rules: CutRules, *, from_end: bool = False) -> int | None:
    """Legal position t in (start, end) such that the part taken, [start, t) or with ``from_end``
    [t, end), costs closest to ``need``; None when the piece is too short to cut."""
    _, start, end = piece
    if not rules.can_cut:
        return None
    lo = -(-(start + rules.min_slice) // rules.align)  # first and last aligned legal cut, in tiles
    hi = (end - rules.min_slice) // rules.align
    if lo > hi:
        return None

    def taken(k: int) -> float:
        """Cost of the part taken when cutting at the k-th candidate, increasing in k."""
        t = (lo + k) * rules.align if not from_end else (hi - k) * rules.align
        return cost(t - start, start) if not from_end else cost(end - t, t)

    a, b = 0, hi - lo  # binary search: the largest k whose part still fits in ``need``
    while a < b:
        mid = (a + b + 1) // 2
        if taken(mid) <= need:
            a = mid
        else:
            b = mid - 1
    if a < hi - lo and taken(a + 1) - need < need - taken(a):
        a += 1
    return (lo + a) * rules.align if not from_end else (hi - a) * rules.align


def piece_costs(pieces: Sequence[Slice], cost: SliceCost) -> np.ndarray:
    """cost of each of ``pieces``, in one vectorised call: cost functions are plain arithmetic, and
    on float64 arrays of integer positions they give, bit for bit, what one call per piece gives."""
    if not pieces:
        return np.zeros(0)
    _, starts, ends = slice_columns(pieces, len(pieces), np.float64)
    return cost(ends - starts, starts)


def cut_into_groups(pieces: Sequence[Slice], num_groups: int, cost: SliceCost, rules: CutRules, *,
                    from_end: bool = False) -> list[list[Slice]]:
    """Cut ``pieces`` (in order) into at most ``num_groups`` non-empty groups of equal cost. With
    ``from_end`` a piece that is cut gives its later tokens to the current group (backward consumes
    a sample's tokens from the end). Fewer groups come back only when there are too few pieces.

    Cutting a piece makes its parts cost a little more than the whole (small slices run less
    efficiently), so budgets computed from whole pieces drift upwards along the sequence; a second
    pass with the first pass's actual total removes that drift."""
    return cut_into_groups_with_positions(pieces, num_groups, cost, rules, from_end=from_end)[0]


def cut_into_groups_with_positions(pieces: Sequence[Slice], num_groups: int, cost: SliceCost, rules: CutRules, *,
                                   from_end: bool = False) -> tuple[list[list[Slice]], dict[int, list[int]]]:
    """``cut_into_groups``'s groups, and per sample the positions where it cut one of ``pieces``
    (each strictly inside the piece it cut, in the order cut)."""
    assert num_groups >= 1
    costs = piece_costs(pieces, cost)
    # the estimate sums the whole pieces last first, as this pass always has (the same float)
    estimate = float(np.sum(np.ascontiguousarray(costs[::-1])))
    _, first_costs, _ = _cut(pieces, costs.tolist(), num_groups, cost, rules, from_end, estimate)
    actual = float(np.sum(np.array(first_costs)))  # as np.sum of ``piece_costs`` of its pieces
    groups, _, positions = _cut(pieces, costs.tolist(), num_groups, cost, rules, from_end, actual)
    return groups, positions


def _cut(pieces: Sequence[Slice], costs: list[float], num_groups: int, cost: SliceCost, rules: CutRules,
         from_end: bool, remaining: float) -> tuple[list[list[Slice]], list[float], dict[int, list[int]]]:
    """One pass: ``costs`` are the pieces' (the head piece's changes where it is cut), ``remaining``
    what the groups still to form should cost together. Returns the groups, the cost of each of
    their pieces in order (a cut piece's parts priced as ``piece_costs`` prices them, bit for bit)
    and the positions cut, per sample."""
    sequence = list(pieces)
    at = 0  # the next piece
    groups: list[list[Slice]] = []
    placed: list[float] = []  # the cost of each piece placed in a group, in order
    positions: dict[int, list[int]] = {}
    linked = 0  # tokens of the run of linked groups the current group continues (0: it starts one)
    no_cut = dataclasses.replace(rules, can_cut=False)
    for g in range(num_groups):
        if at == len(sequence):
            break
        if g == num_groups - 1:
            groups.append(sequence[at:])
            placed += costs[at:]
            break
        budget = remaining / (num_groups - g)
        # whole pieces while they fit, found with running sums in C (the same additions, in the
        # same order, as adding one piece at a time)
        taken_whole, filled = _whole_pieces_within(costs, at, budget)
        group = sequence[at:at + taken_whole]
        whole_costs = costs[at:at + taken_whole]
        remaining = _subtract_each(remaining, whole_costs)
        placed += whole_costs
        at += taken_whole
        if at < len(sequence):
            piece = sequence[at]
            # cutting a new sample in a group that holds the last slice of a cut one links their chains
            # (the group's sample ids are matched against the cut ones in C)
            links = (piece.sample_id not in positions and bool(positions)
                     and not positions.keys().isdisjoint(map(itemgetter(0), group)))
            too_long = links and linked + group_tokens(group) + piece.tokens > rules.max_linked_tokens
            taken, kept = overflow(piece, costs[at], filled, budget, bool(group), cost,
                                   no_cut if too_long else rules, from_end)
            if taken is not None:
                group.append(taken)
                placed.append(costs[at] if kept is None else cost(taken.tokens, taken.start))
                remaining -= placed[-1]
            if kept is None:
                at += 1
            elif taken is not None:
                sequence[at], costs[at] = kept, cost(kept.tokens, kept.start)
                positions.setdefault(piece.sample_id, []).append(kept.end if from_end else kept.start)
        # the group ends inside a sample that the next group continues: the run goes on
        ends_inside = bool(group) and at < len(sequence) and group[-1].sample_id == sequence[at].sample_id
        linked = linked + group_tokens(group) if ends_inside else 0
        groups.append(group)
    return groups, placed, positions


def overflow(piece: Slice, whole: float, filled: float, budget: float, started: bool, cost: SliceCost,
             rules: CutRules, from_end: bool) -> tuple[Slice | None, Slice | None]:
    """The piece (of cost ``whole``) that overflows a group filled to ``filled`` of ``budget``
    (``started``: the group holds something): close the group without it, take it whole, or cut
    it, whichever leaves the group closest to its budget (ties: no cut). (what the group takes,
    what stays for the next group): (None, piece), (piece, None) or the two parts of a cut."""
    leave_gap = budget - filled if started else float("inf")
    take_gap = filled + whole - budget
    t = best_cut(piece, budget - filled, cost, rules, from_end=from_end)
    cut_gap = float("inf")
    if t is not None:
        head, tail = Slice(piece.sample_id, piece.start, t), Slice(piece.sample_id, t, piece.end)
        taken, kept = (tail, head) if from_end else (head, tail)
        cut_gap = abs(filled + cost(taken.tokens, taken.start) - budget)
    if cut_gap < min(leave_gap, take_gap):
        return taken, kept
    if take_gap < leave_gap:
        return piece, None
    return None, piece


def _whole_pieces_within(costs: list[float], at: int, budget: float) -> tuple[int, float]:
    """How many pieces from ``at`` on fit in ``budget`` one after another, and their cost (summed
    from 0.0, piece after piece)."""
    window = 32
    while True:
        running = list(accumulate(costs[at:at + window]))  # non-decreasing: costs are positive
        count = bisect_right(running, budget)
        if count < len(running) or at + window >= len(costs):
            return count, (running[count - 1] if count else 0.0)
        window *= 4


def _subtract_each(total: float, costs: list[float]) -> float:
    """``total`` less each of ``costs`` in turn (a running total's rounding, not the sum's)."""
    return reduce(sub, costs, total)
