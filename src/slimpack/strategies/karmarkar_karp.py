"""Karmarkar–Karp number partitioning: the largest differencing method (LDM), k-way.

Karmarkar & Karp (1982), "The differencing method of set partitioning" (UC Berkeley tech. report);
the k-way form as described by Korf (IJCAI 2009, "Multi-way number partitioning", §2): every item starts as a partial solution of k subsets; the two
partial solutions with the largest spread (heaviest minus lightest subset) are repeatedly merged by
joining the heaviest subset of one with the lightest of the other, the second heaviest with the
second lightest, and so on, until one solution is left. This is the balancer verl uses for sequence
lengths across data-parallel ranks and micro-batches.

With ``equal_count`` (verl's ``equal_size``) the items are sorted and dealt k at a time, one per
subset, into the initial partial solutions; merging keeps the counts equal. Where the number of items
is not a multiple of k, zero-weight placeholders fill the first deal, so counts differ by at most one.

A partial solution keeps only its non-empty subsets (``_Partial``); the others are empty with weight
zero. Micro-batching asks for k close to the number of items (thousands of each at short contexts
and large batches), where spelling out all k subsets of every partial made the method O(n·k) in
time and memory: 5 s per run at n = 4,982 and k = 4,096, and 240 s for kk's plan of one 8M-token
pydocs batch at a 2K context as its micro-batch count was searched upward (3.5 s now). A merge
changes only the subsets it pairs, so those alone are sorted and inserted back; the partitions are
the same as the spelled-out method's, ties included (``tests/strategies/test_packing.py``).
Must not import torch.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from operator import add

Subsets = list[list[int]]


class _Partial:
    """A partial solution's non-empty subsets, heaviest first (ties: the earlier subset first), as
    their negated weights (ascending, for ``bisect``) and their members."""

    __slots__ = ("negated", "members")

    def __init__(self, negated: list[float], members: Subsets) -> None:
        """``negated`` weights and ``members`` of the non-empty subsets, heaviest first."""
        self.negated, self.members = negated, members

    def spread(self, k: int) -> float:
        """Heaviest minus lightest subset (an empty subset weighs zero)."""
        return (self.negated[-1] if len(self.negated) == k else 0.0) - self.negated[0]

    def absorb(self, other: _Partial, k: int) -> None:
        """Merge ``other`` into this one (both consumed): this one's i-th heaviest subset with the
        other's i-th lightest of k. Only this one's lightest subsets (those paired with one of the
        other's non-empty ones) change: they and the other's subsets paired with an empty one are
        taken out, sorted and inserted back after the unchanged subsets of equal weight, which is
        where a stable sort of all k in subset order would put them."""
        mine, theirs = len(self.negated), len(other.negated)
        if theirs == 1:  # one item (most merges where items outnumber subsets): a single insertion
            weight, subset = other.negated[0], other.members[0]
            if mine == k:  # it joins the lightest subset
                weight += self.negated.pop()
                subset = self.members.pop() + subset
            at = bisect_right(self.negated, weight)
            self.negated.insert(at, weight)
            self.members.insert(at, subset)
            return
        kept = min(mine, k - theirs)  # this one's subsets from here on are paired with the other's
        negated: list[float] = []
        members: Subsets = []
        if kept < mine:  # subset j of this one meets subset k - 1 - j of the other
            negated = list(map(add, self.negated[kept:], other.negated[k - mine:k - kept][::-1]))
            members = self.members[kept:]
            for subset, joining in zip(members, other.members[k - mine:k - kept][::-1], strict=True):
                subset.extend(joining)
            del self.negated[kept:], self.members[kept:]
        alone = min(theirs, k - mine)  # the other's subsets that meet an empty one, its lightest first
        negated += other.negated[alone - 1::-1] if alone else []
        members += other.members[alone - 1::-1] if alone else []
        order = sorted(range(len(negated)), key=negated.__getitem__)  # stable: ties keep subset order
        if not kept:
            self.negated = [negated[j] for j in order]
            self.members = [members[j] for j in order]
            return
        for j in order:
            at = bisect_right(self.negated, negated[j])
            self.negated.insert(at, negated[j])
            self.members.insert(at, members[j])


def karmarkar_karp(weights: Sequence[float], k: int, *, equal_count: bool = False) -> Subsets:
    """Partition item indices into ``k`` subsets of about equal total weight (some may be empty when
    there are fewer than ``k`` items). Weights must be positive. Deterministic: ties go to the
    partial solution made first."""
    assert k >= 1
    n = len(weights)
    assert all(w > 0 for w in weights), "karmarkar_karp: weights must be positive"
    seeds: list[_Partial] = []
    if equal_count:
        ranked = sorted(range(n), key=lambda i: (weights[i], i))
        padded: list[int | None] = [None] * (-n % k) + list(ranked)
        for start in range(0, len(padded), k):
            # the heaviest first; equal weights in the order dealt
            deal = [i for i in padded[start:start + k] if i is not None]
            negated = [-float(weights[i]) for i in deal]
            order = sorted(range(len(deal)), key=negated.__getitem__)
            seeds.append(_Partial([negated[j] for j in order], [[deal[j]] for j in order]))
    else:
        seeds = [_Partial([-float(weights[i])], [[i]]) for i in sorted(range(n), key=lambda i: (-weights[i], i))]
    if not seeds:
        return [[] for _ in range(k)]
    heap = [(-partial.spread(k), made, partial) for made, partial in enumerate(seeds)]
    heapq.heapify(heap)
    made = len(heap)
    while len(heap) > 1:
        first = heapq.heappop(heap)[2]
        first.absorb(heapq.heappop(heap)[2], k)
        heapq.heappush(heap, (-first.spread(k), made, first))
        made += 1
    members = heap[0][2].members
    return [sorted(subset) for subset in members] + [[] for _ in range(k - len(members))]
