"""Bin-packing and balancing building blocks shared by the baseline strategies.

Pure functions of item lengths (tokens) and weights (predicted cost): they return item indices per
bin and know nothing of samples, plans or the cost model. Ties are broken by the lower index, so
every result is deterministic. Must not import torch.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from typing import TypeVar

import numpy as np

Bins = list[list[int]]
T = TypeVar("T")


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> Bins:
    """Best-fit decreasing (Johnson, 1973): items longest first, each into the bin with the least room
    left that still holds it, a new bin when none does. This is what TRL's ``pack_dataset(strategy=
    "bfd")`` does with a segment tree; a sorted list of (room, bin) gives the same bins."""
    assert all(0 < n <= capacity for n in lengths), "every item must fit an empty bin"
    bins: Bins = []
    # (room left, bin) as one int, room * stride + bin, in a sorted list: the first at or past
    # n * stride is the best fit (least room, then lowest bin), and ints bisect several times faster
    # than tuples (best-fit-decreasing runs up to 10 times per SlimPack step)
    stride = len(lengths)
    rooms: list[int] = []
    # longest first, ties by index (a stable sort on the negated lengths, in numpy)
    for item in np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable").tolist():
        n = lengths[item]
        pos = bisect_left(rooms, n * stride)
        if pos == len(rooms):
            room_left, target = capacity, len(bins)
            bins.append([])
        else:
            room_left, target = divmod(rooms.pop(pos), stride)
        bins[target].append(item)
        insort(rooms, (room_left - n) * stride + target)
    return bins


def least_loaded_fit(order: Sequence[int], lengths: Sequence[int], weights: Sequence[float],
                     num_bins: int, capacity: int) -> tuple[Bins, list[int]]:
    """WLB-LLM's greedy placement (Wang et al., OSDI'25, Algorithm 1): items in ``order`` each go to the
    bin of least weight if it has room, else to the bin of fewest tokens if that has room, else are
    left over. Returns the bins and the left-over items (in ``order``). Ties go to the lower bin."""
    load = [0.0] * num_bins
    tokens = [0] * num_bins
    # the lightest and the emptiest bin are the tops of two heaps of (value, bin); a bin's older
    # entries are skipped when they surface (loads and token counts only grow), so each item costs
    # O(log bins) instead of two scans of every bin
    by_load = [(0.0, b) for b in range(num_bins)]
    by_tokens = [(0, b) for b in range(num_bins)]
    bins: Bins = [[] for _ in range(num_bins)]
    left: list[int] = []
    for item in order:
        n = lengths[item]
        target = _current_top(by_load, load)
        if tokens[target] + n > capacity:
            target = _current_top(by_tokens, tokens)
            if tokens[target] + n > capacity:
                left.append(item)
                continue
        bins[target].append(item)
        load[target] += weights[item]
        tokens[target] += n
        heappush(by_load, (load[target], target))
        heappush(by_tokens, (tokens[target], target))
    return bins, left


def _current_top(heap: list[tuple[float, int]], values: Sequence[float]) -> int:
    """The bin of least value (the lower bin of equals), its outdated entries popped first."""
    while heap[0][0] != values[heap[0][1]]:
        heappop(heap)
    return heap[0][1]


def smallest_count(build: Callable[[int], T | None], lowest: int, highest: int) -> T:
    """``build(k)`` for k = lowest, lowest+1, ..., highest: the first result that is not None (None
    means k bins do not fit). Scans upward because fit is not monotone in k for these heuristics;
    ``build(highest)`` must succeed (e.g. one item per bin)."""
    for k in range(lowest, highest + 1):
        result = build(k)
        if result is not None:
            return result
    raise AssertionError(f"no bin count in [{lowest}, {highest}] fits")


def small_at_ends(weights: Sequence[float]) -> list[int]:
    """An order of the indices with the heaviest in the middle and weights falling towards both ends,
    dealt alternately to the left and right half. Under 1F1B the first micro-batches fill the
    pipeline and the last ones drain it, so light units there shorten warm-up and cool-down (verl's
    dynamic micro-batch ordering for pipeline parallelism)."""
    heaviest_first = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    left, right = heaviest_first[0::2], heaviest_first[1::2]
    return left[::-1] + right


def contiguous_cuts(weights: Sequence[float], parts: int) -> list[range]:
    """Cut a sequence into ``parts`` contiguous ranges of about equal weight: boundary r sits where
    the running sum is closest to r/parts of the total. Every range is non-empty when there are at
    least ``parts`` items; otherwise one item per range and empty ranges last."""
    n = len(weights)
    if n <= parts:
        return [range(min(r, n), min(r + 1, n)) for r in range(parts)]
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(weights, dtype=np.float64))))
    bounds = [0]
    for r in range(1, parts):
        goal = prefix[-1] * r / parts
        cut = int(np.searchsorted(prefix, goal))
        if cut > 0 and goal - prefix[cut - 1] < prefix[min(cut, n)] - goal:
            cut -= 1
        # non-empty ranges: at least one item after the previous cut, one left for each later part
        bounds.append(min(max(cut, bounds[-1] + 1), n - (parts - r)))
    bounds.append(n)
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
