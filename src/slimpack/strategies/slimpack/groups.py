"""Phase 2 inside one pipeline: forward MicroPacks, their asymmetric backward regrouping, and the
formation (slim / mix / pack) of each forward group.
Must not import torch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from itertools import chain, compress, count
from operator import itemgetter

from slimpack.plan.types import Group, Slice
from slimpack.strategies.slimpack.cutting import CutRules, SliceCost, cut_into_groups_with_positions


def backward_sequence(forward: Sequence[Sequence[Slice]]) -> list[Slice]:
    """The forward slices in order, with each sample's slices reversed over the positions they
    occupy: the order in which backward can consume them (a sample's later slices first) while
    staying close to forward order."""
    flat = list(chain.from_iterable(forward))
    counts = Counter(map(itemgetter(0), flat))
    sliced = {sid for sid, n in counts.items() if n > 1}  # a sample of one slice stays where it is
    if not sliced:
        return flat
    positions: dict[int, list[int]] = {}
    # only the positions of sliced samples' slices are visited (picked out in C)
    for k in compress(count(), map(sliced.__contains__, map(itemgetter(0), flat))):
        positions.setdefault(flat[k].sample_id, []).append(k)
    out = list(flat)
    for places in positions.values():
        for k, source in zip(places, reversed(places), strict=True):
            out[k] = flat[source]
    return out


def refine(groups: Sequence[Sequence[Slice]], cuts: dict[int, list[int]]) -> tuple[Group, ...]:
    """Split slices at extra cut positions (``cuts``: per sample, sorted positions), keeping group
    membership and order."""
    if not cuts:
        return tuple(map(tuple, groups))
    out = []
    for group in groups:
        if cuts.keys().isdisjoint(map(itemgetter(0), group)):  # nothing to split here (checked in C)
            out.append(tuple(group))
            continue
        pieces: list[Slice] = []
        for s in group:
            points = cuts.get(s.sample_id)
            if not points:
                pieces.append(s)
                continue
            inside = points[bisect_right(points, s.start):bisect_left(points, s.end)]
            bounds = [s.start, *inside, s.end]
            pieces.extend(Slice(s.sample_id, a, b) for a, b in zip(bounds, bounds[1:], strict=False))
        out.append(tuple(pieces))
    return tuple(out)


def _canonical(group: Sequence[Slice]) -> Group:
    """Slices of one sample inside a group are listed in data order (the runtime reverses them in
    backward); the order of different samples is kept."""
    if len(set(map(itemgetter(0), group))) == len(group):
        return tuple(group)  # one slice per sample: already in that order
    order = {}
    for s in group:
        order.setdefault(s.sample_id, len(order))
    return tuple(sorted(group, key=lambda s: (order[s.sample_id], s.start)))


def asymmetric_groups(forward: list[list[Slice]], backward_cost: SliceCost, rules: CutRules
                      ) -> tuple[tuple[Group, ...], tuple[Group, ...]]:
    """As many backward groups as forward groups, balanced on backward cost over the same slices,
    cut further where the backward balance needs it; the forward groups get the same extra
    boundaries."""
    backward, positions = cut_into_groups_with_positions(backward_sequence(forward), len(forward), backward_cost,
                                                         rules, from_end=True)
    # backward pieces are forward slices, some cut further (each cut strictly inside a forward
    # slice, so at a position that is no forward boundary): giving forward those cuts too makes
    # both groupings partition the same slices
    cuts = {sid: sorted(points) for sid, points in positions.items()}
    return refine(forward, cuts), tuple(_canonical(g) for g in backward)


def symmetric_backward(forward: Sequence[Group]) -> tuple[Group, ...]:
    """The forward groups in a legal backward order: runs of groups linked by a sliced sample are
    reversed (a sample's later slices go back first), everything else keeps forward order."""
    out: list[Group] = []
    run: list[Group] = []
    for g, group in enumerate(forward):
        run.append(group)
        nxt = forward[g + 1] if g + 1 < len(forward) else ()
        linked = {s.sample_id for s in group} & {s.sample_id for s in nxt}
        if not linked:
            out.extend(reversed(run))
            run = []
    return tuple(out)


def formations(forward: Sequence[Group]) -> tuple[str, ...]:
    """slim: pieces of one sample that spans several groups; pack: only samples entirely inside
    the group; mix: anything else (a sliced sample's piece plus other samples)."""
    ids = [set(map(itemgetter(0), group)) for group in forward]  # (in C: every pipeline of every step)
    groups_of = Counter(chain.from_iterable(ids))  # groups holding each sample
    out = []
    for group_ids in ids:
        if all(groups_of[sid] == 1 for sid in group_ids):
            out.append("pack")
        elif len(group_ids) == 1:
            out.append("slim")
        else:
            out.append("mix")
    return tuple(out)
