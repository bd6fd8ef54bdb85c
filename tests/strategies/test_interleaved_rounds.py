"""Baselines under interleaving pad their micro-batch count to a multiple of pp (``rounds_of``), as
the frameworks they stand for do, instead of failing Megatron's interleaved 1F1B."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.plan.check import check_plan
from slimpack.plan.types import Sample, Slice, group_tokens
from slimpack.sim import simulate
from slimpack.strategies import make_planner
from slimpack.strategies.base import rounds_of
from slimpack.strategies.slimpack.shape import Shape
from slimpack.strategies.wlb import WLBPlanner


def _groups(*token_lists):
    ids = iter(range(1000))
    return [tuple(Slice(next(ids), 0, n) for n in tokens) for tokens in token_lists]


def test_the_largest_splittable_micro_batch_is_halved_by_tokens():
    """pp 4, three micro-batches: the 9-token one cannot be split (one sample); the 8-token one
    (5 + 2 + 1) is, after its first sample (5 against 3 is the cut nearest half: 4)."""
    groups = _groups([9], [5, 2, 1], [3, 3])
    out = rounds_of(groups, 4)
    assert [[s.end for s in g] for g in out] == [[9], [5], [2, 1], [3, 3]]


def test_a_count_already_a_multiple_and_unsplittable_groups_are_left_as_they_are():
    groups = _groups([4, 4], [3])
    assert rounds_of(groups, 2) == groups
    single = _groups([4], [3], [2])
    assert rounds_of(single, 2) == single  # nothing to split: the schedule says why it cannot run


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 500), min_size=1, max_size=6), min_size=1, max_size=12),
       st.sampled_from([2, 3, 4, 8]))
def test_padding_keeps_every_slice_in_order_and_no_micro_batch_grows(token_lists, pp):
    groups = _groups(*token_lists)
    out = rounds_of(groups, pp)
    assert [s for g in out for s in g] == [s for g in groups for s in g]  # nothing lost, order kept
    assert all(out) and max(map(group_tokens, out)) <= max(map(group_tokens, groups))
    splittable = sum(len(g) - 1 for g in groups)  # at most this many splits exist
    assert len(out) % pp == 0 or len(out) == len(groups) + splittable


def test_every_whole_sample_baseline_plans_an_interleaved_batch_it_used_to_refuse():
    """vpp 2 on pp 2 with 10 samples that pack into 3 micro-batches: the baselines used to fail
    ('interleaved 1F1B needs a multiple of pp=2 groups'); now each pads to 4 and simulates."""
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=1, virtual_stages=2),
                          train=TrainConfig(max_context=32768, global_batch_tokens=1 << 17))
    lengths = [32768, 20000, 9000, 7000, 5000, 3000, 2500, 1200, 800, 300]
    batch = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    for name in ("fixed", "bfd", "kk", "wlb", "bytescale"):
        plan = make_planner(name, config).plan(batch, step=0)
        check_plan(plan)
        assert all(len(p.forward) % 2 == 0 for p in plan.pipelines), name
        assert simulate(plan).step_time_s > 0


def test_wlb_under_interleaving_counts_its_micro_batches_in_rounds_of_pp_even_in_its_drain():
    """WLB-LLM sets its micro-batch count itself: under interleaving, a multiple of pp per replica,
    and never more than the documents it packs. pp 2 x vpp 2, dp 2: step 0 queues five 64,000-token
    outliers (the queue opens only when it holds a document per micro-batch: 12 then). The drain
    releases them alone: 320,000 tokens call for 3 micro-batches per replica (4 in rounds of pp),
    but 5 documents cannot fill 8; it used to make 6, i.e. 3 single-document micro-batches on one
    replica, which no padding can split, and fail ('needs a multiple of pp=2 groups, got 3').
    Now it packs them into 4 (one round on each replica)."""
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2, virtual_stages=2),
                          train=TrainConfig(max_context=65536, global_batch_tokens=640_000))
    planner = WLBPlanner(config, outlier_lengths=[40_000], s_max=200_000)
    outliers = [Sample(id=i, length=64_000) for i in range(5)]
    short = [Sample(id=100 + i, length=8_000) for i in range(40)]
    first = planner.plan(outliers + short, step=0)
    assert sorted(first.deferred) == list(range(5))
    assert [len(p.forward) for p in first.pipelines] == [6, 6]
    drain = planner.plan([], step=1)
    check_plan(drain)
    assert [len(p.forward) for p in drain.pipelines] == [2, 2] and not drain.deferred
    assert sorted(s.id for s in drain.trained_samples) == list(range(5))
    assert simulate(drain).step_time_s > 0


@pytest.mark.parametrize(("shape", "counts"), [
    (Shape(128, slicing=False), {72}),  # whole samples: at most the fewest samples (75), in rounds of pp
    (Shape(72, slicing=False), set()),  # already a multiple
    (Shape(90, slicing=True), {88, 96}),  # sliced: the multiples either side
    (Shape(6, slicing=True), {8}),
])
def test_interleaved_slimpack_also_scores_its_leading_counts_in_rounds_of_pp(shape, counts):
    from slimpack.strategies.slimpack.phase1 import Bin
    from slimpack.strategies.slimpack.planner import SlimPackPlanner

    planner = SlimPackPlanner(build_config(parallel=ParallelConfig(tp=8, pp=8, virtual_stages=2),
                                           model="llama2-70b", train=TrainConfig(max_context=8192)))
    bins = [Bin(replicas=(r,), items=tuple(range(100 * r, 100 * r + n)), load=1.0) for r, n in enumerate((75, 80))]
    assert planner._in_rounds(shape, bins) == counts
