"""The dependency graph of one pipeline's actions (DESIGN.md §3 "Dependencies"), shared by the plan
checker and the simulator.

Nodes are (device, position in that device's order). Edges:
- ``seq``: the previous action of the same device (a device runs its order one action at a time);
- ``p2p``: F of a group on virtual stage v after its F on v-1, B on v after B on v+1 (activation or
  gradient sent between devices);
- ``dep``: data dependencies on one virtual stage: F of a sample's slice after F of its earlier
  slices; B of a slice after B of its later slices; on the last virtual stage, B of a group after F
  of every group holding its slices.
Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.errors import InvalidPlanError
from slimpack.plan.types import Action, PipelinePlan

SEQ, P2P, DEP = 0, 1, 2


class ScheduleError(InvalidPlanError):
    """An order that misses or repeats actions, or that deadlocks."""


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


def build_graph(pipeline: PipelinePlan, order: tuple[tuple[Action, ...], ...], *, pp: int, chunks: int,
                where: str = "pipeline") -> ActionGraph:
    if len(order) != pp:
        raise ScheduleError(f"{where}: order has {len(order)} stage(s), the layout has pp={pp}")
    _check_actions(order, len(pipeline.forward), len(pipeline.backward), chunks, where)
    nodes = [(device, action) for device, actions in enumerate(order) for action in actions]
    # (kind, group, virtual stage) -> node
    index = {(kind, group, chunk * pp + device): node
             for node, (device, (kind, group, chunk)) in enumerate(nodes)}
    preds: list[list[tuple[int, int]]] = [[] for _ in nodes]
    pos = 0
    for actions in order:
        for node in range(pos + 1, pos + len(actions)):
            preds[node].append((node - 1, SEQ))
        pos += len(actions)
    last = pp * chunks - 1
    for (kind, group, vstage), node in index.items():
        if kind == "F":
            if vstage > 0:
                preds[node].append((index[("F", group, vstage - 1)], P2P))
        elif vstage < last:
            preds[node].append((index[("B", group, vstage + 1)], P2P))
    # data dependencies between slices of one sample, on every virtual stage
    f_group = {(s.sample_id, s.start): g for g, grp in enumerate(pipeline.forward) for s in grp}
    b_group = {(s.sample_id, s.start): g for g, grp in enumerate(pipeline.backward) for s in grp}
    chains: dict[int, list[tuple[int, int]]] = {}
    for sample_id, start in f_group:
        chains.setdefault(sample_id, []).append((start, sample_id))
    dep_pairs_f: set[tuple[int, int]] = set()
    dep_pairs_b: set[tuple[int, int]] = set()
    for sample_id, starts in chains.items():
        starts.sort()
        for (a, _), (b, _) in zip(starts, starts[1:], strict=False):
            fa, fb = f_group[(sample_id, a)], f_group[(sample_id, b)]
            if fa != fb:
                dep_pairs_f.add((fa, fb))  # F(fb) after F(fa)
            ba, bb = b_group[(sample_id, a)], b_group[(sample_id, b)]
            if ba != bb:
                dep_pairs_b.add((bb, ba))  # B(ba) after B(bb)
    for vstage in range(last + 1):
        for before, after in dep_pairs_f:
            preds[index[("F", after, vstage)]].append((index[("F", before, vstage)], DEP))
        for before, after in dep_pairs_b:
            preds[index[("B", after, vstage)]].append((index[("B", before, vstage)], DEP))
    last_pairs = {(f_group[key], b_group[key]) for key in f_group}
    for fg, bg in last_pairs:
        preds[index[("B", bg, last)]].append((index[("F", fg, last)], DEP))
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
        done = set(out)
        stuck = []
        for node in range(num):
            device, action = graph.nodes[node]
            seq_done = all(p in done for p, kind in graph.preds[node] if kind == SEQ)
            if node not in done and seq_done:
                waits = [graph.nodes[p] for p, kind in graph.preds[node] if kind != SEQ and p not in done]
                what = ", ".join(f"{a} on stage {d}" for d, a in waits[:2])
                stuck.append(f"stage {device} waits at {action} for {what}")
        raise ScheduleError(f"{where}: the order deadlocks: " + "; ".join(stuck[:4]))
    return out
