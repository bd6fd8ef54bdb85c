"""The data dependencies of a pipeline's groups (``dag.data_dependencies``) and the forwards each
backward needs (``builders.backward_needs``), against a slice-by-slice reference; the graph's edges
(``dag.build_graph``) against the per-stream rule the schedulers read (``dag.dependencies``)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slimpack.errors import ScheduleError
from slimpack.plan.types import Slice
from slimpack.schedule import backward_needs
from slimpack.schedule.actions import Action
from slimpack.schedule.dag import (
    P2P,
    SEQ,
    build_graph,
    data_dependencies,
    dependencies,
    slice_table,
    topological_order,
)


def _reference(forward, backward):
    """One slice at a time: consecutive slices of a sample in different groups make a pair."""
    f_group = {(s.sample_id, s.start): g for g, group in enumerate(forward) for s in group}
    b_group = {(s.sample_id, s.start): g for g, group in enumerate(backward) for s in group}
    keys = sorted(f_group)
    f_pairs, b_pairs = set(), set()
    for earlier, later in zip(keys, keys[1:], strict=False):
        if earlier[0] != later[0]:
            continue
        if f_group[earlier] != f_group[later]:
            f_pairs.add((f_group[earlier], f_group[later]))
        if b_group[earlier] != b_group[later]:
            b_pairs.add((b_group[later], b_group[earlier]))  # backward runs the later slice first
    last_stage = {(f_group[k], b_group[k]) for k in keys}
    need, most = [], 0
    for group in backward:
        most = max([most, *(f_group[(s.sample_id, s.start)] + 1 for s in group)])
        need.append(most)
    return sorted(f_pairs), sorted(b_pairs), sorted(last_stage), need


@st.composite
def _groupings(draw):
    """Samples cut into slices, dealt into forward groups and, separately, into backward groups
    (any grouping: the functions read groups, not schedules)."""
    slices = []
    for sample_id in draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=12, unique=True)):
        cuts = sorted(draw(st.sets(st.integers(1, 99), max_size=4)))
        bounds = [0, *cuts, 100]
        slices += [Slice(sample_id, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]

    def deal():
        count = draw(st.integers(1, len(slices)))
        owner = draw(st.lists(st.integers(0, count - 1), min_size=len(slices), max_size=len(slices)))
        order = draw(st.permutations(range(len(slices))))
        groups = [[] for _ in range(count)]
        for i in order:
            groups[owner[i]].append(slices[i])
        return tuple(tuple(g) for g in groups)  # some groups may be empty

    forward = deal()
    return forward, draw(st.sampled_from([forward, None])) or deal()


@given(_groupings())
def test_dependencies_and_needs_match_the_slice_by_slice_reference(groupings):
    forward, backward = groupings
    deps = data_dependencies(forward, backward)
    f_pairs, b_pairs, last_stage, need = _reference(forward, backward)
    assert deps.forward == f_pairs
    assert deps.backward == b_pairs
    assert deps.last_stage == last_stage
    assert backward_needs(forward, backward) == need


def test_a_chain_cut_three_ways_with_regrouped_backwards():
    # sample 0 cut at 10 and 20 into forward groups 0, 1, 2; sample 1 whole in group 3.
    # backward groups: [s0's last slice], [its first two], [s1]
    s0 = [Slice(0, 0, 10), Slice(0, 10, 20), Slice(0, 20, 30)]
    s1 = Slice(1, 0, 5)
    forward = ((s0[0],), (s0[1],), (s0[2],), (s1,))
    backward = ((s0[2],), (s0[0], s0[1]), (s1,))
    deps = data_dependencies(forward, backward)
    assert deps.forward == [(0, 1), (1, 2)]
    assert deps.backward == [(0, 1)]  # B of group 1 (slices 0, 1) after B of group 0 (slice 2)
    assert deps.last_stage == [(0, 1), (1, 1), (2, 0), (3, 2)]
    assert backward_needs(forward, backward) == [3, 3, 4]


def test_backward_groups_of_other_slices_are_refused():
    forward = ((Slice(0, 0, 10), Slice(0, 10, 20)),)
    with pytest.raises(ScheduleError, match="other slices"):
        data_dependencies(forward, ((Slice(0, 0, 20),),))


def test_the_slice_table_of_the_same_groups_is_computed_once_and_cannot_be_changed():
    forward = ((Slice(0, 0, 10),), (Slice(0, 10, 20), Slice(1, 0, 5)))
    backward = ((Slice(0, 10, 20),), (Slice(0, 0, 10), Slice(1, 0, 5)))
    table = slice_table(forward, backward)
    assert slice_table(forward, backward) is table
    sample, f_group, b_group = table
    assert sample.tolist() == [0, 0, 1] and f_group.tolist() == [0, 1, 1] and b_group.tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="read-only"):
        f_group[0] = 1
    # groups that can change (lists) are read afresh every time
    changing = [[Slice(0, 0, 10)], [Slice(0, 10, 20), Slice(1, 0, 5)]]
    assert slice_table(changing, changing)[1].tolist() == [0, 1, 1]
    changing[0].append(changing[1].pop())
    assert slice_table(changing, changing)[1].tolist() == [0, 1, 0]


def test_the_slice_tables_kept_hold_at_most_the_budgets_slices(monkeypatch):
    from slimpack.schedule import dag

    monkeypatch.setattr(dag, "SLICE_TABLES_KEPT", 5)
    first = ((Slice(0, 0, 10), Slice(0, 10, 20), Slice(1, 0, 5)),)
    second = ((Slice(2, 0, 10),), (Slice(3, 0, 10), Slice(3, 10, 20)))
    table = slice_table(first, first)
    assert slice_table(first, first) is table  # 3 slices: kept
    slice_table(second, second)  # 3 more: over the budget, the oldest goes
    assert slice_table(first, first) is not table
    too_big = tuple((Slice(4, k, k + 1),) for k in range(6))
    assert slice_table(too_big, too_big) is not slice_table(too_big, too_big)  # never kept


@given(_groupings(), st.integers(1, 4), st.integers(1, 2), st.randoms(use_true_random=False))
def test_the_graph_has_the_edges_of_the_dependency_rule(groupings, pp, chunks, rng):
    forward, backward = groupings
    num_vstages = pp * chunks
    # any order holding every action once (the edges do not depend on it; it may deadlock)
    order = []
    for _ in range(pp):
        actions = [Action(kind, g, c) for kind, groups in (("F", forward), ("B", backward))
                   for g in range(len(groups)) for c in range(chunks)]
        rng.shuffle(actions)
        order.append(tuple(actions))
    graph = build_graph(forward, backward, tuple(order), pp=pp, chunks=chunks)
    streams = [(kind, v) for kind in "FB" for v in range(num_vstages)]
    rule = dependencies(forward, backward, streams, num_vstages=num_vstages)
    stream_group = [(s, g) for s in range(len(streams)) for g in range(rule.first[s + 1] - rule.first[s])]
    nodes = graph.nodes()
    for node, (device, (kind, group, chunk)) in enumerate(nodes):
        vstage = chunk * pp + device
        preds = graph.preds(node)
        stream = streams.index((kind, vstage))
        numbers = ([rule.p2p_source[stream] + group] if rule.p2p_source[stream] >= 0 else []) + \
            rule.data_needs(stream, group)
        expected = [(streams[s][0], g, streams[s][1]) for s, g in map(stream_group.__getitem__, numbers)]
        assert [(nodes[p][1].kind, nodes[p][1].group, nodes[p][1].chunk * pp + nodes[p][0]) for p, edge in preds if edge != SEQ] == expected
        assert [p for p, edge in preds if edge == SEQ] == ([] if node in graph.first else [node - 1])
        assert graph.p2p_input[node] == next((p for p, edge in preds if edge == P2P), -1)


def test_a_backward_before_the_forward_it_needs_deadlocks():
    # one sample cut in two, forward groups 0 and 1; on one stage the backward of the later slice's
    # group runs before that group's forward
    forward = ((Slice(0, 0, 10),), (Slice(0, 10, 20),))
    good = ((Action("F", 0), Action("F", 1), Action("B", 1), Action("B", 0)),)
    bad = ((Action("F", 0), Action("B", 1), Action("F", 1), Action("B", 0)),)
    assert topological_order(build_graph(forward, forward, good, pp=1, chunks=1)) == [0, 1, 2, 3]
    with pytest.raises(ScheduleError, match="deadlocks"):
        topological_order(build_graph(forward, forward, bad, pp=1, chunks=1))
