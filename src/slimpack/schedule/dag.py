"""The dependency graph of one pipeline's actions (DESIGN.md §3 "Dependencies"), shared by the plan
checker and the simulator.

Nodes are (device, position in that device's order). Edges:
- ``seq``: the previous action of the same device (a device runs its order one action at a time);
- ``p2p``: an action after the action whose output it receives (``schedule.lowering``: F of a group
  on virtual stage v after its F on v-1, B on v after B on v+1);
- ``dep``: data dependencies on one virtual stage: F of a sample's slice after F of its earlier
  slices; B of a slice after B of its later slices; on the last virtual stage, B of a group after F
  of every group holding its slices.
Must not import torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter

from slimpack.errors import ScheduleError
from slimpack.schedule.actions import Action, Order, SliceKey
from slimpack.schedule.lowering import deadlock_message, input_source

SEQ, P2P, DEP = 0, 1, 2


@dataclass(slots=True)
class ActionGraph:
    pp: int
    chunks: int
    nodes: list[tuple[int, Action]]
    """(device, action) per node id; node ids run device by device in order."""
    preds: list[list[tuple[int, int]]]
    """Per node: (predecessor node id, edge kind SEQ/P2P/DEP)."""

    def virtual_stage(self, node: int) -> int:
        device, action = self.nodes[node]
        return action.chunk * self.pp + device


def _check_actions(order: tuple[tuple[Action, ...], ...], num_forward: int, num_backward: int,
                   chunks: int, where: str) -> None:
    # Actions are tuples, so they compare and hash like the (kind, group, chunk) keys here
    expected = {("F", g, c) for g in range(num_forward) for c in range(chunks)}
    expected |= {("B", g, c) for g in range(num_backward) for c in range(chunks)}
    for stage, actions in enumerate(order):
        seen = set(actions)
        if len(seen) == len(expected) == len(actions) and seen == expected:
            continue  # the common case, decided without a loop in Python
        seen = set()
        for action in actions:
            if action not in expected:
                raise ScheduleError(f"{where}: stage {stage} has action {action} which names no group/chunk "
                                    f"of this pipeline ({num_forward} forward, {num_backward} backward groups)")
            if action in seen:
                raise ScheduleError(f"{where}: stage {stage} runs {action} twice")
            seen.add(action)
        missing = expected - seen
        example = Action(*sorted(missing)[0])  # type: ignore[arg-type]
        raise ScheduleError(f"{where}: stage {stage} never runs {example} ({len(missing)} action(s) missing)")


ActionKey = tuple[str, int, int]
"""An action as the graph keys it: (kind, group, virtual stage)."""


def dependencies(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], *,
                 num_vstages: int) -> dict[ActionKey, list[tuple[ActionKey, int]]]:
    """Every action's predecessors other than its device's previous action: (key, P2P or DEP). The
    rule for any order, so the graph builder and the schedule builders read it from here."""
    preds: dict[ActionKey, list[tuple[ActionKey, int]]] = {}
    last = num_vstages - 1
    for kind, groups in (("F", forward), ("B", backward)):
        for vstage in range(num_vstages):
            source = input_source(kind, vstage, num_vstages)
            for group in range(len(groups)):
                preds[(kind, group, vstage)] = [] if source is None else [((kind, group, source), P2P)]
    # data dependencies between slices of one sample, on every virtual stage (the maps are built
    # with C-level iterators: a pipeline holds thousands of slices and the simulator builds this
    # graph for every candidate the planner scores)
    f_group = slice_groups(forward)
    b_group = f_group if backward is forward else slice_groups(backward)  # 1F1B plans share their groups
    counts = Counter(map(itemgetter(0), f_group))
    chains: dict[int, list[int]] = {}
    for sample_id, start in f_group:
        if counts[sample_id] > 1:  # a sample of one slice has no chain
            chains.setdefault(sample_id, []).append(start)
    dep_pairs_f: set[tuple[int, int]] = set()
    dep_pairs_b: set[tuple[int, int]] = set()
    for sample_id, starts in chains.items():
        starts.sort()
        for a, b in zip(starts, starts[1:], strict=False):
            fa, fb = f_group[(sample_id, a)], f_group[(sample_id, b)]
            if fa != fb:
                dep_pairs_f.add((fa, fb))  # F(fb) after F(fa)
            ba, bb = b_group[(sample_id, a)], b_group[(sample_id, b)]
            if ba != bb:
                dep_pairs_b.add((bb, ba))  # B(ba) after B(bb)
    pairs_f, pairs_b = sorted(dep_pairs_f), sorted(dep_pairs_b)
    for vstage in range(num_vstages):
        for before, after in pairs_f:
            preds[("F", after, vstage)].append((("F", before, vstage), DEP))
        for before, after in pairs_b:
            preds[("B", after, vstage)].append((("B", before, vstage), DEP))
    for fg, bg in sorted(set(zip(f_group.values(), map(b_group.__getitem__, f_group), strict=True))):
        preds[("B", bg, last)].append((("F", fg, last), DEP))
    return preds


def slice_groups(groups: Sequence[Sequence[SliceKey]]) -> dict[tuple[int, int], int]:
    """(sample id, start) of each slice -> its group's index (built with C-level iterators)."""
    keys = map(itemgetter(0, 1), chain.from_iterable(groups))
    return dict(zip(keys, chain.from_iterable(repeat(g, len(group)) for g, group in enumerate(groups)), strict=True))


def build_graph(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], order: Order, *,
                pp: int, chunks: int, where: str = "pipeline") -> ActionGraph:
    """The graph of ``order`` over a pipeline's ``forward`` and ``backward`` groups. Raises
    ``ScheduleError`` for an order that misses or repeats actions (a cycle shows in ``topological_order``)."""
    if len(order) != pp:
        raise ScheduleError(f"{where}: order has {len(order)} stage(s), the layout has pp={pp}")
    _check_actions(order, len(forward), len(backward), chunks, where)
    nodes = [(device, action) for device, actions in enumerate(order) for action in actions]
    index = {(kind, group, chunk * pp + device): node
             for node, (device, (kind, group, chunk)) in enumerate(nodes)}
    preds: list[list[tuple[int, int]]] = [[] for _ in nodes]
    pos = 0
    for actions in order:
        for node in range(pos + 1, pos + len(actions)):
            preds[node].append((node - 1, SEQ))
        pos += len(actions)
    for key, before in dependencies(forward, backward, num_vstages=pp * chunks).items():
        preds[index[key]].extend((index[pred], kind) for pred, kind in before)
    return ActionGraph(pp=pp, chunks=chunks, nodes=nodes, preds=preds)


def topological_order(graph: ActionGraph, where: str = "pipeline") -> list[int]:
    """Kahn's algorithm; a leftover node means the order deadlocks (raises ``ScheduleError``)."""
    num = len(graph.nodes)
    succs: list[list[int]] = [[] for _ in range(num)]
    missing = [0] * num
    for node, preds in enumerate(graph.preds):
        missing[node] = len(preds)
        for pred, _ in preds:
            succs[pred].append(node)
    ready = [n for n in range(num) if missing[n] == 0]
    out: list[int] = []
    while ready:
        node = ready.pop()
        out.append(node)
        for nxt in succs[node]:
            missing[nxt] -= 1
            if missing[nxt] == 0:
                ready.append(nxt)
    if len(out) < num:
        raise ScheduleError(_deadlock(graph, set(out), where))
    return out


def _deadlock(graph: ActionGraph, done: set[int], where: str) -> str:
    """Where each device stands (a device's done nodes are a prefix of its order) and what its first
    waiting action waits for, as ``lowering.deadlock_message`` shows it."""
    order: list[list[Action]] = [[] for _ in range(graph.pp)]
    position = [0] * graph.pp
    waits: dict[int, str] = {}
    for node, (device, action) in enumerate(graph.nodes):
        order[device].append(action)
        if node in done:
            position[device] += 1
        elif device not in waits:
            missing = [graph.nodes[p] for p, kind in graph.preds[node] if kind != SEQ and p not in done]
            waits[device] = ", ".join(f"{a} on stage {d}" for d, a in missing[:2])
    return deadlock_message(order, position, waits, where=where)
