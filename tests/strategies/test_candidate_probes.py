"""The candidate check builds a whole-document candidate only if its probe (one pipeline of it
alone) does not already rule it out: that is exact only if a probe's step never exceeds its plan's."""

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import config, synthetic_batch
from slimpack.cost import CostModel
from slimpack.sim import simulate, step_time
from slimpack.strategies.slimpack.candidates import (
    Candidate,
    fastest_fitting,
    plan_fits,
    sliced_sequence_plans,
)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), pp=st.sampled_from([2, 4]), dp=st.sampled_from([2, 3]))
def test_a_probe_bounds_its_plan_from_below(seed, pp, dp):
    cfg = config(pp=pp, dp=dp, max_context=32768)
    cost = CostModel(cfg)
    candidates = sliced_sequence_plans(synthetic_batch(seed, 400_000 * dp, 32768), 0, cfg)
    assert candidates
    for candidate in candidates:
        probe, plan = candidate.probe(), candidate.build()
        assert len(probe.pipelines) == 1 and probe.pipelines[0] in plan.pipelines
        assert step_time(probe, cost) <= simulate(plan, cost).step_time_s


def test_the_fastest_fitting_candidate_wins_only_if_strictly_faster_than_the_bar():
    cfg = config(pp=4, dp=2, max_context=32768)
    cost = CostModel(cfg)
    plans = [c.build() for c in sliced_sequence_plans(synthetic_batch(3, 800_000, 32768), 0, cfg)]
    times = [simulate(p, cost).step_time_s for p in plans]
    fitting = [i for i, p in enumerate(plans) if plan_fits(p, cost)]
    assert fitting
    fastest = min(fitting, key=lambda i: (times[i], i))
    found = fastest_fitting([Candidate.of(p) for p in plans], cost)
    assert found is not None and found[0] is plans[fastest] and found[1] == times[fastest]
    assert fastest_fitting([Candidate.of(p) for p in plans], cost, beat=times[fastest]) is None
    beaten = fastest_fitting([Candidate.of(p) for p in plans], cost, beat=times[fastest] * 1.000001)
    assert beaten is not None and beaten[0] is plans[fastest]
