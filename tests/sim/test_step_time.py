"""``step_time`` and ``step_and_peak``: the simulator's step time (and peak memory) without the rest of its
result, and the early give-up (of ``step_time`` and ``pipelines_step_and_peak``) for ruling plans out."""

from hypothesis import given, settings
from hypothesis import strategies as st

from random_plans import plans
from slimpack.cost import CostModel
from slimpack.sim import pipelines_step_and_peak, simulate, step_and_peak, step_time


@settings(max_examples=60, deadline=None)
@given(plans(), st.floats(0.0, 2.0))
def test_step_time_is_the_simulated_step_or_a_bound_past_the_give_up(plan, fraction):
    cost = CostModel(plan.config)
    full = simulate(plan, cost, check=False).step_time_s
    assert step_time(plan, cost) == full  # bit for bit
    bar = fraction * full
    early = step_time(plan, cost, give_up_at=bar)
    if bar > full:
        assert early == full  # a step faster than the bar is simulated to the end
    else:
        assert bar <= early <= full  # given up: a lower bound that already reaches the bar


@settings(max_examples=40, deadline=None)
@given(plans())
def test_step_and_peak_are_the_simulated_ones(plan):
    cost = CostModel(plan.config)
    result = simulate(plan, cost, check=False)
    assert step_and_peak(plan, cost) == (result.step_time_s, max(result.peak_memory_bytes))


@settings(max_examples=40, deadline=None)
@given(plans(), st.floats(0.0, 2.0))
def test_step_and_peak_given_up_are_lower_bounds_past_the_bar(plan, fraction):
    cost = CostModel(plan.config)
    result = simulate(plan, cost, check=False)
    full_step, full_peak = result.step_time_s, max(result.peak_memory_bytes)
    bar = fraction * full_step
    step, peak = pipelines_step_and_peak(plan.config, enumerate(plan.pipelines), cost, give_up_at=bar)
    if bar > full_step:
        assert (step, peak) == (full_step, full_peak)
    else:
        assert bar <= step <= full_step and peak <= full_peak
