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
Must not import torch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from operator import add

Subsets = list[list[int]]
EMPTY: list[int] = []
"""The empty subset every item's own partial solution starts with k - 1 of (shared, never mutated:
a merge replaces it rather than extending it), so that n items do not cost n·k lists."""


def _partial(sums: list[float], members: Subsets) -> tuple[list[float], Subsets]:
    """A partial solution with its subsets sorted heaviest first (ties: the earlier subset first:
    a reversed sort is still stable)."""
    order = sorted(range(len(sums)), key=sums.__getitem__, reverse=True)
    return [sums[j] for j in order], [members[j] for j in order]


def karmarkar_karp(weights: Sequence[float], k: int, *, equal_count: bool = False) -> Subsets:
    """Partition item indices into ``k`` subsets of about equal total weight (some may be empty when
    there are fewer than ``k`` items). Deterministic: ties go to the partial solution made first."""
    assert k >= 1
    n = len(weights)
    seeds: list[tuple[list[float], Subsets]] = []
    if equal_count:
        ranked = sorted(range(n), key=lambda i: (weights[i], i))
        padded: list[int | None] = [None] * (-n % k) + list(ranked)
        for start in range(0, len(padded), k):
            deal = padded[start:start + k]
            seeds.append(_partial([0.0 if i is None else float(weights[i]) for i in deal],
                                  [[] if i is None else [i] for i in deal]))
    else:
        for i in sorted(range(n), key=lambda i: (-weights[i], i)):
            seeds.append(([float(weights[i])] + [0.0] * (k - 1), [[i]] + [EMPTY] * (k - 1)))
    if not seeds:
        return [[] for _ in range(k)]
    heap = [(-(sums[0] - sums[-1]), made, sums, members) for made, (sums, members) in enumerate(seeds)]
    heapq.heapify(heap)
    made = len(heap)
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        # heaviest of one with lightest of the other: the differencing step. Each partial owns its
        # subsets' lists and both are consumed here, so a's lists take b's members in place (an
        # empty subset, the shared EMPTY, takes b's list itself)
        for j, theirs in enumerate(reversed(members_b)):
            if not theirs:
                continue
            if members_a[j]:
                members_a[j].extend(theirs)
            else:
                members_a[j] = theirs
        sums, members = _partial(list(map(add, sums_a, reversed(sums_b))), members_a)
        heapq.heappush(heap, (-(sums[0] - sums[-1]), made, sums, members))
        made += 1
    members = heap[0][3]
    return [sorted(subset) for subset in members]
