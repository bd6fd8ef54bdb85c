"""The planner's array shortcuts give, bit for bit, what the plain per-item loops give: whole-piece
costs in one call, and a schedule's peak memory as a cumulative sum."""

from hypothesis import given, settings
from hypothesis import strategies as st

from random_plans import plans
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.plan.types import Slice
from slimpack.strategies.slimpack.cutting import piece_costs
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
