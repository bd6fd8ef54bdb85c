"""Invariants of every baseline on random batches: no token lost or duplicated, deferred included."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.plan.check import check_plan
from slimpack.plan.types import Sample
from slimpack.strategies import make_planner
from slimpack.strategies.wlb import WLBPlanner

CONTEXT = 4096
CONFIG = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                      train=TrainConfig(max_context=CONTEXT, global_batch_tokens=16 * CONTEXT))
REUSED_IDS = {"fixed", "slimpipe"}  # documents straddling a sequence cut become new samples

lengths = st.lists(st.integers(1, CONTEXT), max_size=40)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["fixed", "bfd", "kk", "wlb", "slimpipe", "bytescale"]), lengths)
def test_every_token_is_planned_once(name, batch_lengths):
    batch = [Sample(id=i, length=n) for i, n in enumerate(batch_lengths)]
    plan = make_planner(name, CONFIG).plan(batch, step=0)
    check_plan(plan)  # every non-deferred token in exactly one forward and one backward group
    assert sum(s.length for s in plan.samples) == sum(batch_lengths)
    if name not in REUSED_IDS:
        assert sorted((s.id, s.length) for s in plan.samples) == sorted((s.id, s.length) for s in batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(lengths, min_size=1, max_size=4),
       st.lists(st.integers(512, CONTEXT), max_size=3), st.sampled_from([None, CONTEXT, 2 * CONTEXT]))
def test_wlb_schedules_every_sample_exactly_once_across_steps(steps, thresholds, s_max):
    planner = WLBPlanner(CONFIG, outlier_lengths=thresholds, s_max=s_max)
    arrived: dict[int, Sample] = {}
    trained: Counter[int] = Counter()
    next_id = 0
    for step in range(len(steps) + 40):  # the data, then empty batches: the stream has ended
        batch = [Sample(id=next_id + i, length=n, arrival_step=step)
                 for i, n in enumerate(steps[step] if step < len(steps) else [])]
        next_id += len(batch)
        arrived.update((s.id, s) for s in batch)
        plan = planner.plan(batch, step=step)
        check_plan(plan)
        held = set(plan.deferred)
        for s in plan.samples:
            assert s == arrived[s.id]  # given back unchanged: same length, original arrival step
            if s.id not in held:
                trained[s.id] += 1
        if step >= len(steps) and not plan.deferred:
            break
    assert not plan.deferred
    assert trained == Counter(arrived.keys())
