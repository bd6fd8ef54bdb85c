"""The planner's shortcuts give, bit for bit, what the plain per-item loops give: whole-piece costs in
one call, a schedule's peak memory as a cumulative sum, and cutting with running sums in C."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import config
from random_plans import plans
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.plan.types import Slice
from slimpack.strategies.slimpack.cutting import (
    CutRules,
    cut_into_groups,
    cut_into_groups_with_positions,
    overflow,
    piece_costs,
)
from slimpack.strategies.slimpack.memory import stage_peak_bytes


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200_000), st.integers(1, 131_072)), min_size=1, max_size=40),
       st.sampled_from([1, 2, 4]), st.booleans())
def test_piece_costs_equal_one_call_per_piece(pieces, cp, backward):
    layout = build_config(parallel=ParallelConfig(pp=4, cp=cp), train=TrainConfig(max_context=131072))
    cost = CostModel(layout).slice_cost_function(backward=backward, extra_per_token=1e-7)
    slices = [Slice(i, start, start + tokens) for i, (start, tokens) in enumerate(pieces)]
    assert piece_costs(slices, cost).tolist() == [cost(s.end - s.start, s.start) for s in slices]


def _running_peaks(pipe, order, cfg, cost):
    """The simulator's memory rule as a running total, one action at a time."""
    pp = cfg.parallel.pp
    tokens = {"F": [sum(s.tokens for s in g) for g in pipe.forward], "B": [sum(s.tokens for s in g) for g in pipe.backward]}
    peaks = []
    for device, actions in enumerate(order):
        held = peak = 0.0
        for a in actions:
            size = tokens[a.kind][a.group]
            kept = cost.activation_bytes(size, virtual_stage=a.chunk * pp + device, cp=pipe.cp)
            if a.kind == "F":
                held += kept
            peak = max(peak, held + cost.working_bytes(size, cp=pipe.cp))
            if a.kind == "B":
                held -= kept
        peaks.append(cost.model_state_bytes(device) + peak)
    return peaks


@settings(max_examples=60, deadline=None)
@given(plans())
def test_stage_peaks_equal_the_running_total(plan):
    cost = CostModel(plan.config)
    for pipe in plan.pipelines:
        assert stage_peak_bytes(pipe, pipe.order, plan.config, cost) == _running_peaks(pipe, pipe.order, plan.config, cost)


def _cut_one_piece_at_a_time(pieces, num_groups, cost, rules, from_end, remaining):
    """The greedy pass adding one whole piece at a time (the overflowing piece handled as ``_cut`` does):
    the reference for ``cutting._cut``'s running sums."""
    queue = list(reversed(pieces))
    groups = []
    for g in range(num_groups):
        if not queue:
            break
        if g == num_groups - 1:
            groups.append(queue[::-1])
            break
        budget, group, filled = remaining / (num_groups - g), [], 0.0
        while queue:
            piece = queue[-1]
            whole = cost(piece.end - piece.start, piece.start)
            if filled + whole <= budget:
                group.append(queue.pop())
                filled += whole
                remaining -= whole
                continue
            taken, kept = overflow(piece, whole, filled, budget, bool(group), cost, rules, from_end)
            if taken is not None:
                group.append(taken)
                remaining -= whole if kept is None else cost(taken.tokens, taken.start)
            if kept is None:
                queue.pop()
            else:
                queue[-1] = kept
            break
        groups.append(group)
    return groups


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 131_072), min_size=1, max_size=300), st.integers(1, 80), st.booleans(),
       st.booleans())
def test_cutting_equals_the_one_piece_at_a_time_loop(lengths, num_groups, from_end, can_cut):
    cost = CostModel(config(pp=4, max_context=131072)).slice_cost_function(backward=from_end)
    rules = CutRules(can_cut=can_cut, min_slice=1024, align=128)
    pieces = [Slice(i, 0, n) for i, n in enumerate(sorted(lengths, reverse=True))]
    estimate = float(np.sum(piece_costs(pieces[::-1], cost)))
    first = _cut_one_piece_at_a_time(pieces, num_groups, cost, rules, from_end, estimate)
    actual = float(np.sum(piece_costs([s for group in first for s in group], cost)))
    expected = _cut_one_piece_at_a_time(pieces, num_groups, cost, rules, from_end, actual)
    assert cut_into_groups(pieces, num_groups, cost, rules, from_end=from_end) == expected
    # the positions it reports are exactly the ends its groups have that the pieces had not
    groups, positions = cut_into_groups_with_positions(pieces, num_groups, cost, rules, from_end=from_end)
    new_ends = {(s.sample_id, s.end) for group in groups for s in group} - {(s.sample_id, s.end) for s in pieces}
    assert sorted((sid, t) for sid, points in positions.items() for t in points) == sorted(new_ends)
