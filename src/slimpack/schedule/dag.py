"""The dependency graph of one pipeline's actions (DESIGN.md §3 "Dependencies"), shared by the plan
checker and the simulator.

Nodes are the actions, numbered device by device in each device's order. Edges:
- ``seq``: the previous action of the same device (a device runs its order one action at a time);
- ``p2p``: an action after the action whose output it receives (``schedule.lowering``: F of a group
  on virtual stage v after its F on v-1, B on v after B on v+1);
- ``dep``: data dependencies on one virtual stage: F of a sample's slice after F of its earlier
  slices; B of a slice after B of its later slices; on the last virtual stage, B of a group after F
  of every group holding its slices.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import itemgetter
from threading import Lock

import numpy as np

from slimpack.errors import ScheduleError
from slimpack.schedule.actions import Action, Order, SliceKey, slice_columns
from slimpack.schedule.lowering import deadlock_message, input_source

SEQ, P2P, DEP = 0, 1, 2


@dataclass(slots=True)
class ActionGraph:
    """Node ids run device by device, each device's actions in its order. Per node, as arrays: its
    device, virtual stage, group and whether it is a forward (read in C from the order: the
    simulator builds the graph of every candidate pipeline the planner scores)."""

    pp: int
    order: Order
    first: list[int]
    """Device d's nodes are ``first[d]`` .. ``first[d + 1] - 1``."""
    device: np.ndarray
    vstage: np.ndarray
    group: np.ndarray
    forward: np.ndarray
    p2p_input: list[int]
    """Per node: its P2P predecessor (the one input from another device), or -1."""
    dep_edges: tuple[np.ndarray, np.ndarray]
    """The ``dep`` edges as (after, before) node arrays, in the order ``dependencies`` lists them
    per node. (The ``seq`` edges are implicit in the node ids.)"""

    @property
    def deps_in_order(self) -> bool:
        """Whether every ``dep`` edge runs forward in its device's order. Each joins two actions of
        one virtual stage, so of one device: then it is implied by the ``seq`` edges, and the order
        is free of cycles if the ``seq`` and ``p2p`` edges are; else the order deadlocks."""
        after, before = self.dep_edges
        return bool(np.all(before < after))

    def dep_preds(self) -> dict[int, list[int]]:
        """The nodes with data dependencies: their ``dep`` predecessors."""
        out: dict[int, list[int]] = {}
        for node, pred in zip(*(edges.tolist() for edges in self.dep_edges), strict=True):
            out.setdefault(node, []).append(pred)
        return out

    def nodes(self) -> list[tuple[int, Action]]:
        """(device, action) per node id."""
        return [(device, action) for device, actions in enumerate(self.order) for action in actions]

    def preds(self, node: int) -> list[tuple[int, int]]:
        """A node's (predecessor, edge kind SEQ/P2P/DEP): its device's previous action, its P2P
        input, then its data dependencies."""
        out = [(node - 1, SEQ)] if node not in self.first else []
        if self.p2p_input[node] >= 0:
            out.append((self.p2p_input[node], P2P))
        after, before = self.dep_edges
        return out + [(pred, DEP) for pred in before[after == node].tolist()]


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


@dataclass(frozen=True, slots=True)
class DataDependencies:
    """The ``dep`` edges of a pipeline's groups, as pairs of group indices (the same on every
    virtual stage, except ``last_stage``), each list sorted."""

    forward: list[tuple[int, int]]
    """(before, after): F of forward group ``after`` after F of ``before``, on every virtual stage."""
    backward: list[tuple[int, int]]
    """(before, after): B of backward group ``after`` after B of ``before``, on every virtual stage."""
    last_stage: list[tuple[int, int]]
    """(forward group, backward group): on the last virtual stage, B of the backward group after F
    of the forward group (it holds some of its slices)."""


def data_dependencies(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]]
                      ) -> DataDependencies:
    """The data dependencies between slices of one sample, as group pairs: consecutive slices of a
    sample (``slice_table`` lists them side by side) in different groups."""
    sample, f_group, b_group = slice_table(forward, backward)
    chained = sample[1:] == sample[:-1]  # slice i + 1 continues slice i's sample
    f_before, f_after = f_group[:-1][chained], f_group[1:][chained]
    b_before, b_after = b_group[1:][chained], b_group[:-1][chained]  # backward runs the later slice first
    span = max(len(forward), len(backward))
    return DataDependencies(_group_pairs(f_before, f_after, f_before != f_after, span),
                            _group_pairs(b_before, b_after, b_before != b_after, span),
                            _group_pairs(f_group, b_group, None, span))


def _group_pairs(first: np.ndarray, second: np.ndarray, keep: np.ndarray | None, span: int) -> list[tuple[int, int]]:
    """The distinct (first, second) pairs (where ``keep``), sorted; group indices are below ``span``."""
    codes = np.unique(first * span + second if keep is None else first[keep] * span + second[keep])
    return list(zip((codes // span).tolist(), (codes % span).tolist(), strict=True))


SLICE_TABLES_KEPT = 1 << 20
"""How many slices the tables ``slice_table`` keeps may hold together (about 100 MB with the groups
they keep alive): the planner orders a pipeline when it builds it (``builders.backward_needs``) and
the simulator reads the same groups when it scores it, after up to a plan's whole set of pipelines
has been built (at 2048 GPUs and 128K contexts, 64 pipelines of about 2,000 slices each)."""
_slice_tables: dict[tuple[int, int], tuple[object, object, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
_slice_tables_held = 0  # slices in the tables kept
_slice_tables_lock = Lock()


def slice_table(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every slice of a pipeline in (sample id, start) order, as three aligned (read-only) arrays:
    its sample id, its forward group's index and its backward group's index. Sorted in numpy: a
    pipeline holds thousands of slices, and the simulator builds the graph of every candidate the
    planner scores. The forward and backward groups must hold the same slices (``check_groups``
    checks it first).

    The table of the same two group objects is computed once (a pipeline's groups are immutable
    tuples, and half the calls of a planner's step are the simulator's second look at a pipeline it
    has just ordered). The memo keys on the objects' identities and keeps the objects, so an id
    cannot be reused by another object while its table is kept."""
    key = (id(forward), id(backward))
    with _slice_tables_lock:
        kept = _slice_tables.get(key)
    if kept is not None:
        return kept[2]
    table = _slice_table(forward, backward)
    if _immutable(forward) and _immutable(backward) and len(table[0]) <= SLICE_TABLES_KEPT:  # a list could change
        global _slice_tables_held
        with _slice_tables_lock:
            if key not in _slice_tables:
                _slice_tables[key] = (forward, backward, table)
                _slice_tables_held += len(table[0])
            while _slice_tables_held > SLICE_TABLES_KEPT:
                _slice_tables_held -= len(_slice_tables.pop(next(iter(_slice_tables)))[2][0])  # the oldest first
    return table


def _immutable(groups: Sequence[Sequence[SliceKey]]) -> bool:
    return type(groups) is tuple and all(type(group) is tuple for group in groups)


def _slice_table(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sample, start, f_group = _slices_in_order(forward)
    if backward is forward:  # 1F1B plans share their groups
        table = sample, f_group, f_group
    else:
        b_sample, b_start, b_group = _slices_in_order(backward)
        if not (np.array_equal(sample, b_sample) and np.array_equal(start, b_start)):
            raise ScheduleError("the backward groups hold other slices than the forward groups")
        table = sample, f_group, b_group
    for column in table:
        column.setflags(write=False)  # shared by every caller of the memo
    return table


def _slices_in_order(groups: Sequence[Sequence[SliceKey]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sample ids, starts, group indices) of the groups' slices, sorted by (sample id, start)."""
    sizes = np.fromiter(map(len, groups), dtype=np.int64, count=len(groups))
    sample, start, _ = slice_columns(chain.from_iterable(groups), int(sizes.sum()))
    order = np.lexsort((start, sample))
    return sample[order], start[order], np.repeat(np.arange(len(groups)), sizes)[order]


@dataclass(frozen=True, slots=True)
class StreamDependencies:
    """Every action's predecessors other than its device's previous action, per stream (one kind of
    action on one virtual stage) and group, with actions numbered stream after stream: group ``g``
    of stream ``s`` is action ``first[s] + g``."""

    first: list[int]
    p2p_source: list[int]
    """Per stream, the number of its P2P source stream's first action (group g waits for that
    number + g), or -1 (no input from another virtual stage)."""
    data: list[dict[int, list[int]]]
    """Per stream, group -> the actions it waits for by data dependency, numbered from ``data_base``
    (most groups wait for none). A sample's slices chain within one stream, so one dict of group
    indices serves every stream of a kind, with the stream's first action as its base: building a
    dict of action numbers per stream took most of the list scheduler's set-up under interleaving."""
    data_base: list[int]
    """Per stream, the number the entries of its ``data`` count from."""

    def data_needs(self, stream: int, group: int) -> list[int]:
        """The numbers of the actions group ``group`` of ``stream`` waits for by data dependency."""
        return [self.data_base[stream] + number for number in self.data[stream].get(group, ())]


def dependencies(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]],
                 streams: Sequence[tuple[str, int]], *, num_vstages: int) -> StreamDependencies:
    """The P2P input, the data dependencies on every virtual stage, and on the last one a backward
    after the forwards holding its slices, per stream (``streams`` lists each (kind, virtual stage)
    of the pipeline). The rule for any order, so the schedule builders read it from here (the graph
    builder reads the same rule by node id). Built per stream, not per action: the list scheduler
    asks for it for every pipeline it orders, tens of thousands of actions under interleaving."""
    counts = {"F": len(forward), "B": len(backward)}
    first = list(accumulate((counts[kind] for kind, _ in streams), initial=0))
    number = {stream: i for i, stream in enumerate(streams)}
    deps = data_dependencies(forward, backward)
    earlier: dict[str, dict[int, list[int]]] = {"F": {}, "B": {}}  # per kind: group -> the groups it waits for
    for kind, pairs in (("F", deps.forward), ("B", deps.backward)):
        for before, after in pairs:
            earlier[kind].setdefault(after, []).append(before)
    p2p_source = []
    for kind, vstage in streams:
        source = input_source(kind, vstage, num_vstages)
        p2p_source.append(-1 if source is None else first[number[(kind, source)]])
    data = [earlier[kind] for kind, _ in streams]
    data_base = first[:-1]
    if deps.last_stage:  # the pipeline holds slices, so both kinds have streams
        # the last stage's backwards also wait for forwards, another stream: that one stream's
        # entries are whole action numbers (base 0)
        last_b, last_f = number[("B", num_vstages - 1)], number[("F", num_vstages - 1)]
        data[last_b] = {group: [first[last_b] + before for before in befores] for group, befores in data[last_b].items()}
        data_base[last_b] = 0
        for fg, bg in deps.last_stage:
            data[last_b].setdefault(bg, []).append(first[last_f] + fg)
    return StreamDependencies(first, p2p_source, data, data_base)


def build_graph(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], order: Order, *,
                pp: int, chunks: int, where: str = "pipeline") -> ActionGraph:
    """The graph of ``order`` over a pipeline's ``forward`` and ``backward`` groups. Raises
    ``ScheduleError`` for an order that misses or repeats actions (a cycle shows in ``topological_order``)."""
    if len(order) != pp:
        raise ScheduleError(f"{where}: order has {len(order)} stage(s), the layout has pp={pp}")
    _check_actions(order, len(forward), len(backward), chunks, where)
    sizes = list(map(len, order))
    first = list(accumulate(sizes, initial=0))
    num = first[-1]
    actions = list(chain.from_iterable(order))
    device = np.repeat(np.arange(pp), sizes)
    group = np.fromiter(map(itemgetter(1), actions), dtype=np.int64, count=num)
    chunk = np.fromiter(map(itemgetter(2), actions), dtype=np.int64, count=num)
    is_forward = np.fromiter(map("F".__eq__, map(itemgetter(0), actions)), dtype=bool, count=num)
    vstage = chunk * pp + device
    num_vstages = pp * chunks
    # node_of[kind][virtual stage, group]: the node of that action (each is in the order once)
    node_of = {}
    for kind, mine, count in (("F", is_forward, len(forward)), ("B", ~is_forward, len(backward))):
        node_of[kind] = np.zeros((num_vstages, count), dtype=np.int64)
        node_of[kind][vstage[mine], group[mine]] = np.flatnonzero(mine)
    # the edges of ``dependencies``: the P2P input, then the data dependencies, in its order per node
    p2p_input = np.full(num, -1)
    for kind in "FB":
        for stage in range(num_vstages):
            source = input_source(kind, stage, num_vstages)
            if source is not None:
                p2p_input[node_of[kind][stage]] = node_of[kind][source]
    deps = data_dependencies(forward, backward)
    after, before = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for kind, pairs in (("F", deps.forward), ("B", deps.backward)):
        if pairs:
            earlier, later = np.array(pairs).T
            after.append(node_of[kind][:, later].ravel())  # virtual stage by virtual stage
            before.append(node_of[kind][:, earlier].ravel())
    if deps.last_stage:
        fg, bg = np.array(deps.last_stage).T
        after.append(node_of["B"][-1][bg])
        before.append(node_of["F"][-1][fg])
    return ActionGraph(pp=pp, order=order, first=first, device=device, vstage=vstage,
                       group=group, forward=is_forward, p2p_input=p2p_input.tolist(),
                       dep_edges=(np.concatenate(after), np.concatenate(before)))


def topological_order(graph: ActionGraph, where: str = "pipeline") -> list[int]:
    """A topological order of the graph; a node left out means the order deadlocks (raises
    ``ScheduleError``). A device runs its order one action at a time, so every topological order
    takes each device's actions in that order: the devices are swept, each running its next
    actions while their inputs are done, until none can move (sweeps alternate direction, as
    forwards flow down the stages and backwards up). No successor lists are built, which makes this
    a fraction of Kahn's algorithm's cost on the graphs the simulator sees; it leaves out the
    same nodes (those that wait, directly or not, on a cycle). A node's ``seq`` edge holds by the
    sweep itself, and so do its ``dep`` edges when they run forward on their device (the common
    case, checked on arrays first); only its P2P input is checked then."""
    p2p_input, first = graph.p2p_input, graph.first
    dep_preds = {} if graph.deps_in_order else graph.dep_preds()
    num = first[-1]
    position = first[:-1]
    done = [False] * num + [True]  # done[-1] stands for "no P2P input"
    out: list[int] = []
    devices = list(range(graph.pp))
    moved = True
    while moved:
        moved = False
        for device in devices:
            node, end = position[device], first[device + 1]
            while node < end and done[p2p_input[node]]:
                waits_on = dep_preds.get(node)
                if waits_on is not None and not all(map(done.__getitem__, waits_on)):
                    break
                done[node] = True
                out.append(node)
                node += 1
            if node > position[device]:
                position[device], moved = node, True
        devices.reverse()
    if len(out) < num:
        raise ScheduleError(_deadlock(graph, set(out), where))
    return out


def _deadlock(graph: ActionGraph, done: set[int], where: str) -> str:
    """Where each device stands (a device's done nodes are a prefix of its order) and what its first
    waiting action waits for, as ``lowering.deadlock_message`` shows it."""
    order: list[list[Action]] = [[] for _ in range(graph.pp)]
    position = [0] * graph.pp
    waits: dict[int, str] = {}
    nodes = graph.nodes()
    for node, (device, action) in enumerate(nodes):
        order[device].append(action)
        if node in done:
            position[device] += 1
        elif device not in waits:
            missing = [nodes[p] for p, kind in graph.preds(node) if kind != SEQ and p not in done]
            waits[device] = ", ".join(f"{a} on stage {d}" for d, a in missing[:2])
    return deadlock_message(order, position, waits, where=where)
