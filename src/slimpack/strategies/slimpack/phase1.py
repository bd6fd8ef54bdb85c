"""Phase 1 (DP-aware): spread samples over data-parallel replicas by cost, merging replicas into a
context-parallel group for outliers (DP-Merge).

Replicas may get different numbers of samples; what is balanced is the total (forward + backward)
cost, so that every replica reaches the gradient all-reduce together. An outlier whose cost exceeds
``merge_share`` of one replica's share of the batch (or whose activations cannot fit one pipeline)
is given to k merged replicas, which then run it with k-fold context parallelism and get k shares of
the rest of the batch. When there are more memory-bound outliers than replicas to merge for each,
the rest share merged pipelines wide enough to hold them (one at a time: the schedule's memory cap
keeps a pipeline to what it can hold).
Must not import torch.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Bin:
    replicas: tuple[int, ...]
    items: tuple[int, ...]
    """Indices into the caller's item list."""
    load: float


def plan_merges(costs: Sequence[float], dp: int, *, merge_share: float | None,
                min_ways: Sequence[int]) -> list[tuple[int, int]]:
    """(item, k) for each outlier to run on k merged replicas, heaviest first. ``min_ways[i]`` is the
    fewest replicas item i needs for memory (1 when one pipeline holds it); ``merge_share=None``
    turns DP-Merge off (memory-bound items then stay on one replica and will be reported OOM). A
    memory-bound item left without replicas of its own is placed by ``balance`` on a merged
    pipeline that is wide enough."""
    if merge_share is None or dp == 1:
        return []
    share = sum(costs) / dp
    merges: list[tuple[int, int]] = []
    used = 0
    # memory-bound items first (they cannot run otherwise), then outliers by cost; an item that is
    # neither would end the loop below, so only these are sorted
    outlier = merge_share * share
    # (picked out in numpy: the same divisions, over the 10^5 samples of a batch on thousands of GPUs)
    needy = np.flatnonzero((np.asarray(min_ways) > 1) | (np.asarray(costs, dtype=np.float64) / outlier > 1)).tolist()
    by_need = sorted(needy, key=lambda i: (-(min_ways[i] > 1), -costs[i], i))
    for item in by_need:
        if min_ways[item] > dp - used:
            continue  # too few replicas left for it: ``balance`` puts it on a wide enough merged pipeline
        ways = min(max(min_ways[item], math.ceil(costs[item] / outlier)), dp - used)
        if ways <= 1:
            break  # memory-bound items came first, the rest by cost: no later item is an outlier
        merges.append((item, ways))
        used += ways
    return merges


def place_merged(widths: Sequence[int], dp: int, nodes: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> list[tuple[int, ...]]:
    """The replicas of each merged group of these widths (in the order given). Without ``nodes``,
    one after another from replica 0. With ``nodes`` (per replica, the node of its first and of its
    last rank), widest first, each on one node where one has that many free replicas (the node
    with the fewest such, then the lowest, so that wide groups find room later), else on the nodes
    with the most free replicas (so it spans as few as it can): a group whose ranks lie on several
    nodes runs its context-parallel ring at the inter-node link (the simulator charges it). A group
    need not be consecutive replicas; on one node it is as fast as if it were."""
    if nodes is None:
        ends = np.cumsum(widths).tolist()
        return [tuple(range(end - w, end)) for w, end in zip(widths, ends, strict=True)]
    # each replica's node; a replica that spans nodes gets a home of its own, -1-r
    home = [first if first == last else -1 - r
            for r, (first, last) in enumerate(zip(*(np.asarray(n).tolist() for n in nodes), strict=True))]
    free: dict[int, list[int]] = {}  # per home, its free replicas
    for r in range(dp):
        free.setdefault(home[r], []).append(r)
    placed: list[tuple[int, ...]] = [()] * len(widths)
    for i in sorted(range(len(widths)), key=lambda i: (-widths[i], i)):
        w = widths[i]
        roomy = [n for n, left in free.items() if len(left) >= w]
        if roomy:
            taken = free[min(roomy, key=lambda n: (len(free[n]), n))][:w]
        else:
            fullest_first = sorted(free, key=lambda n: (-len(free[n]), n))
            taken = [r for n in fullest_first for r in free[n]][:w]
        for r in taken:
            free[home[r]].remove(r)
        placed[i] = tuple(sorted(taken))
    return placed


def balance(costs: Sequence[float], dp: int, merges: Sequence[tuple[int, int]], *,
            merged_speed: Mapping[int, float] | None = None, min_ways: Sequence[int] | None = None,
            nodes: tuple[np.ndarray, np.ndarray] | None = None) -> list[Bin]:
    """Pipelines (merged groups first, then single replicas) and the items each runs. Items go
    heaviest first to the pipeline whose load per unit of speed is lowest (LPT on uniform
    machines, Graham 1969), then single items move from the most to the least loaded pipeline
    while that lowers the maximum. A pipeline of k merged replicas counts as ``k * merged_speed``
    replicas' speed: context parallelism and the outlier's chain make it slower than k replicas,
    and the planner measures by how much (so the merged pipeline ends with the others). Item i
    goes only to pipelines of at least ``min_ways[i]`` replicas while one exists (otherwise to the
    widest, where the simulator will report it out of memory). ``nodes``: where merged groups go
    (``place_merged``)."""
    bins_replicas = place_merged([ways for _, ways in merges], dp, nodes)
    members: list[list[int]] = [[item] for item, _ in merges]
    loads: list[float] = [costs[item] for item, _ in merges]
    taken = {r for block in bins_replicas for r in block}
    for r in range(dp):
        if r not in taken:
            bins_replicas.append((r,))
            members.append([])
            loads.append(0.0)
    speeds = merged_speed or {}
    counts = [len(r) for r in bins_replicas]  # replicas per pipeline
    width = [k * speeds.get(k, 1.0) for k in counts]
    merged = {i for i, _ in merges}
    widest = max(counts)
    need = np.minimum(min_ways, widest).tolist() if min_ways else [1] * len(costs)
    # one heap of (load, bin) per (replicas, width): the best bin for an item is the best heap top
    # that is wide enough. Keyed by the replica count too, because two counts can share a width
    # (3 merged replicas at a third of the speed each are as fast as one): one heap for both would
    # show only its top's count, and an item that needs 3 replicas could land on a single one.
    heaps: dict[tuple[int, float], list[tuple[float, int]]] = {}
    for b, key in enumerate(zip(counts, width, strict=True)):
        heaps.setdefault(key, []).append((loads[b], b))
    for heap in heaps.values():
        heapq.heapify(heap)
    heaviest_first = np.argsort(-np.asarray(costs, dtype=np.float64), kind="stable").tolist()  # ties: lower index first
    if merged:
        heaviest_first = [i for i in heaviest_first if i not in merged]
    only = next(iter(heaps)) if len(heaps) == 1 else None  # one kind of pipeline: every bin is wide enough
    kinds = list(heaps.items())
    for item in heaviest_first:
        if only is not None:
            key = only
        else:  # the heap top that ends least loaded per unit of speed (then the lower bin) among the wide enough
            # (a plain loop: this runs for each of 10^4-10^5 items, several times per step)
            cost, needed, best, best_bin = costs[item], need[item], math.inf, -1
            for kind, heap in kinds:
                load, b = heap[0]
                per = (load + cost) / kind[1]
                if kind[0] >= needed and (per < best or (per == best and b < best_bin)):
                    best, best_bin, key = per, b, kind
            assert best_bin >= 0, "the widest pipelines hold every item"
        load, target = heaps[key][0]
        members[target].append(item)
        loads[target] = load + costs[item]
        heapq.heapreplace(heaps[key], (loads[target], target))  # pop the lightest, push it back heavier
    _improve(costs, members, loads, width, merged, need, counts)
    return [Bin(tuple(r), tuple(m), load) for r, m, load in zip(bins_replicas, members, loads, strict=True)]


def _improve(costs: Sequence[float], members: list[list[int]], loads: list[float], width: list[float],
             pinned: set[int], need: Sequence[int], replicas: Sequence[int], rounds: int = 200) -> None:
    """Move one item from the most loaded pipeline to the least loaded one while it helps (and the
    least loaded one has the replicas the item needs)."""
    for _ in range(rounds):
        per = [load / w for load, w in zip(loads, width, strict=True)]
        hi = max(range(len(per)), key=lambda b: (per[b], -b))
        lo = min(range(len(per)), key=lambda b: (per[b], b))
        gap = per[hi] - per[lo]
        best, best_max = None, per[hi]
        for item in members[hi]:
            if item in pinned or need[item] > replicas[lo]:
                continue
            new_hi = (loads[hi] - costs[item]) / width[hi]
            new_lo = (loads[lo] + costs[item]) / width[lo]
            if max(new_hi, new_lo) < best_max - 1e-12 * gap:
                best, best_max = item, max(new_hi, new_lo)
        if best is None:
            return
        members[hi].remove(best)
        members[lo].append(best)
        loads[hi] -= costs[best]
        loads[lo] += costs[best]
