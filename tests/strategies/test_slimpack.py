import dataclasses
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.plan import Sample, Slice, plan_to_dict
from slimpack.plan.check import check_plan
from slimpack.sim import simulate, step_time
from slimpack.strategies import make_planner
from slimpack.strategies.slimpack import candidates, phase1
from slimpack.strategies.slimpack.cutting import CutRules, best_cut, cut_into_groups
from slimpack.strategies.slimpack.groups import backward_sequence, formations, symmetric_backward
from slimpack.strategies.slimpack.milp import rebalance
from slimpack.strategies.slimpack.phase1 import balance, plan_merges
from slimpack.strategies.slimpack.planner import EXACT_RANKS, SlimPackPlanner
from slimpack.strategies.slimpack.shape import SYMMETRIC, Shape, rank
from slimpack.strategies.stream import stream_batches


def _config(pp=2, dp=2, context=32768, **planner):
    return build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=pp, dp=dp),
                        train=TrainConfig(max_context=context, global_batch_tokens=1 << 20),
                        planner=PlannerConfig(**planner))


def _tokens(plan, which):
    covered = {}
    for pipe in plan.pipelines:
        for group in getattr(pipe, which):
            for s in group:
                covered.setdefault(s.sample_id, []).append((s.start, s.end))
    return covered


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 32768), min_size=1, max_size=40), pp=st.sampled_from([1, 2, 4]),
       dp=st.sampled_from([1, 2, 3]), switches=st.tuples(*[st.booleans()] * 4))
# hypothesis seed 406: a candidate given up exactly at the threshold tied, won, and reported its bound
@example(lengths=[747, 1062, 1193, 14604, 15609, 19540], pp=2, dp=2, switches=(False, False, False, False))
def test_every_plan_validates_and_covers_every_token_once(lengths, pp, dp, switches):
    slicing, asymmetric, merge, milp = switches
    config = _config(pp=pp, dp=dp, use_slicing=slicing, use_asymmetric=asymmetric, use_dp_merge=merge,
                     use_milp=milp)
    batch = [Sample(id=10 + i, length=n) for i, n in enumerate(lengths)]
    plan = make_planner("slimpack", config).plan(batch, step=3)
    check_plan(plan)
    slimpack_info = plan.info.get("slimpack", plan.info)  # a candidate that won keeps SlimPack's own info
    if plan.info["candidate"] == "slimpack":  # the planner's step without a plan-wide simulation: bit for bit
        assert slimpack_info["step_s"] == step_time(plan)
    for which in ("forward", "backward"):
        covered = _tokens(plan, which)
        for sample in batch:
            ranges = sorted(covered[sample.id])
            assert ranges[0][0] == 0 and ranges[-1][1] == sample.length
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    if not slicing:
        assert all(len(r) == 1 for r in _tokens(plan, "forward").values())


def test_same_input_gives_the_identical_plan():
    batch = [Sample(id=i, length=n) for i, n in enumerate([30000, 12000, 900, 4000, 27000, 150, 2048, 8000] * 3)]
    config = _config(pp=4, dp=2)
    first = plan_to_dict(make_planner("slimpack", config).plan(batch, step=0))
    second = plan_to_dict(make_planner("slimpack", config).plan(batch, step=0))
    for plan in (first, second):
        plan["info"].pop("planner_time_s")
    assert first == second


def test_long_samples_are_sliced_into_equal_cost_slices_that_shrink():
    cost = CostModel(_config())
    rules = CutRules(can_cut=True, min_slice=1024, align=128)
    groups = cut_into_groups([Slice(0, 0, 131072)], 8, lambda c, p: cost.slice_cost(c, p, backward=False), rules)
    sizes = [g[0].tokens for g in groups]
    assert len(groups) == 8 and sum(sizes) == 131072
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 2 * sizes[-1]
    costs = [cost.slice_cost(g[0].tokens, g[0].start, backward=False) for g in groups]
    assert max(costs) / min(costs) < 1.02
    assert all(g[0].start % 128 == 0 for g in groups)


def test_cuts_respect_the_minimum_slice_and_alignment():
    rules = CutRules(can_cut=True, min_slice=1024, align=128)
    assert best_cut(Slice(0, 0, 2000), 10.0, lambda c, p: float(c), rules) is None  # too short to cut
    assert best_cut(Slice(0, 0, 10000), 5000.0, lambda c, p: float(c), rules) == 4992
    assert best_cut(Slice(0, 0, 10000), 10.0, lambda c, p: float(c), rules) == 1024
    # from the end: the tail [t, 10000) should cost ~3000 tokens
    assert best_cut(Slice(0, 0, 10000), 3000.0, lambda c, p: float(c), rules, from_end=True) == 7040
    assert best_cut(Slice(0, 0, 10000), 5000.0, lambda c, p: float(c), CutRules(False, 1024, 128)) is None



def test_a_new_sample_is_not_cut_where_it_would_link_chains_past_the_cap():
    tokens = lambda c, p: 1.0 * c  # noqa: E731 (vectorised by total_cost)
    pieces = [Slice(0, 0, 15), Slice(1, 0, 15)]
    # budgets of 10: sample 0 is cut at 10; the next group holds its last slice and, uncapped,
    # the first slice of sample 1 (linking the two chains: 30 tokens held at once)
    assert cut_into_groups(pieces, 3, tokens, CutRules(True, 1, 1)) == [
        [Slice(0, 0, 10)], [Slice(0, 10, 15), Slice(1, 0, 5)], [Slice(1, 5, 15)]]
    # capped at 20 tokens, the group closes instead (closer to its budget than taking sample 1 whole)
    assert cut_into_groups(pieces, 3, tokens, CutRules(True, 1, 1, max_linked_tokens=20)) == [
        [Slice(0, 0, 10)], [Slice(0, 10, 15)], [Slice(1, 0, 15)]]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=30), num_groups=st.integers(1, 20))
def test_without_room_to_link_no_group_joins_two_cut_samples(lengths, num_groups):
    pieces = [Slice(i, 0, n) for i, n in enumerate(lengths)]
    groups = cut_into_groups(pieces, num_groups, lambda c, p: c + 1e-4 * c * (p + c / 2),
                             CutRules(True, 64, 16, max_linked_tokens=0))
    cut = {s.sample_id for g in groups for s in g if s.tokens < lengths[s.sample_id]}
    for group in groups:
        ends = {s.sample_id for s in group if s.sample_id in cut and s.end == lengths[s.sample_id] and s.start > 0}
        starts = {s.sample_id for s in group if s.sample_id in cut and s.start == 0}
        assert not (ends and starts - ends), group

def test_backward_sequence_reverses_each_sample_in_place():
    fwd = [[Slice(0, 0, 10)], [Slice(0, 10, 20), Slice(1, 0, 5)], [Slice(1, 5, 9), Slice(2, 0, 3)]]
    assert backward_sequence(fwd) == [Slice(0, 10, 20), Slice(0, 0, 10), Slice(1, 5, 9), Slice(1, 0, 5), Slice(2, 0, 3)]
    assert formations([tuple(g) for g in fwd]) == ("slim", "mix", "mix")
    assert formations([(Slice(3, 0, 4), Slice(4, 0, 2))]) == ("pack",)
    groups = [tuple(g) for g in fwd] + [(Slice(3, 0, 4),)]
    assert symmetric_backward(groups) == (groups[2], groups[1], groups[0], groups[3])


def test_phase1_balances_cost_and_merges_outliers():
    costs = [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    bins = balance(costs, 2, [])
    assert abs(bins[0].load - bins[1].load) <= 1.0  # 55 in integer costs: 27 / 28 at best
    assert sorted(i for b in bins for i in b.items) == list(range(10))
    # one sample costing as much as the rest together: 2 replicas' shares at threshold 1.0, 4 at 0.5
    costs = [40.0] + [1.0] * 40
    assert plan_merges(costs, 4, merge_share=0.5, min_ways=[1] * 41) == [(0, 4)]
    merges = plan_merges(costs, 4, merge_share=1.0, min_ways=[1] * 41)
    assert merges == [(0, 2)]
    bins = balance(costs, 4, merges)
    assert bins[0].replicas == (0, 1) and 0 in bins[0].items
    assert sorted(len(b.replicas) for b in bins) == [1, 1, 2]
    loads = sorted(b.load / len(b.replicas) for b in bins)
    assert loads[-1] - loads[0] <= 1.0
    assert plan_merges(costs, 4, merge_share=None, min_ways=[1] * 41) == []
    # memory forces a merge even below the share threshold
    assert plan_merges([1.0, 1.0, 1.0], 4, merge_share=0.5, min_ways=[1, 3, 1]) == [(1, 3)]



def test_memory_bound_outliers_beyond_the_replicas_share_merged_pipelines():
    # three samples that each need 2 replicas, on 4 replicas: two get a merged pair of their own,
    # the third cannot, and shares one of the pairs instead of going to a single replica (OOM)
    costs = [5.0, 5.0, 5.0] + [1.0] * 20
    min_ways = [2, 2, 2] + [1] * 20
    merges = plan_merges(costs, 4, merge_share=10.0, min_ways=min_ways)
    assert merges == [(0, 2), (1, 2)]
    bins = balance(costs, 4, merges, min_ways=min_ways)
    assert [len(b.replicas) for b in bins] == [2, 2]
    assert 2 in bins[0].items or 2 in bins[1].items


def test_merged_groups_are_placed_on_one_node_where_they_can_be():
    # 4 replicas per node (tp 2 on 8-GPU nodes). Given heaviest first as (2, 4, 2), one after another
    # would put the 4-wide group on replicas 2..5, across nodes 0 and 1: widest first, it takes node 0
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, dp=12)))
    nodes = cost.replica_nodes(np.arange(12), stage=0)
    assert phase1.place_merged([2, 4, 2], 12) == [(0, 1), (2, 3, 4, 5), (6, 7)]
    assert phase1.place_merged([2, 4, 2], 12, nodes) == [(4, 5), (0, 1, 2, 3), (6, 7)]
    # the fullest node that has room (best fit): the 2-wide groups share node 1, not node 0's one left
    assert phase1.place_merged([3, 2, 2], 12, nodes) == [(0, 1, 2), (4, 5), (6, 7)]
    # wider than a node: whole nodes first, so it spans as few as it can
    assert phase1.place_merged([6, 3], 12, nodes) == [(0, 1, 2, 3, 4, 5), (8, 9, 10)]
    # one 3-wide group per node, the fourth on the replicas left (one per node: it must span nodes)
    assert phase1.place_merged([3, 3, 3, 3], 12, nodes) == [(0, 1, 2), (4, 5, 6), (8, 9, 10), (3, 7, 11)]
    bins = balance([5.0, 4.0, 1.0, 1.0], 12, [(0, 2), (1, 4)], nodes=nodes)
    assert [b.replicas for b in bins[:2]] == [(4, 5), (0, 1, 2, 3)] and [b.replicas for b in bins[2:]] == \
        [(r,) for r in range(6, 12)]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2]), st.lists(st.integers(1, 9), min_size=1, max_size=8),
       st.data())
def test_placed_merged_groups_are_disjoint_and_on_one_node_where_one_has_room(tp, cp, widths, data):
    dp = data.draw(st.integers(sum(widths), sum(widths) + 12))
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=tp, cp=cp, dp=dp)))
    placed = phase1.place_merged(widths, dp, cost.replica_nodes(np.arange(dp), stage=0))
    assert [len(p) for p in placed] == widths
    flat = [r for p in placed for r in p]
    assert len(set(flat)) == len(flat) and all(0 <= r < dp for r in flat)
    span = tp * cp  # ranks per replica, 8 per node
    if span > 8:  # every replica spans nodes: nothing to place well
        return
    per_node = 8 // span
    if all(w & (w - 1) == 0 for w in widths):  # powers of two fit their nodes like buddies
        for p in placed:
            assert cost.cp_crosses_nodes(p, stage=0) == (len(p) > per_node)
    # widest first, a group spans nodes only where, at its turn, no node had room for it
    free = [min(per_node, dp - n * per_node) for n in range(-(-dp // per_node))]
    for i in sorted(range(len(widths)), key=lambda i: (-widths[i], i)):
        assert cost.cp_crosses_nodes(placed[i], stage=0) == (max(free) < widths[i])
        for r in placed[i]:
            free[r // per_node] -= 1


def test_merged_pipelines_across_nodes_they_could_share_one_of_send_the_batch_to_aligned_merged_replicas():
    def across(tp: int, *groups: tuple[int, ...]) -> bool:
        planner = SlimPackPlanner(build_config(model="llama2-7b", parallel=ParallelConfig(tp=tp, dp=8)))
        return planner._merged_across_nodes(types.SimpleNamespace(pipelines=[
            types.SimpleNamespace(replicas=g) for g in groups]))

    # tp 2: four replicas per node (0-3, 4-7)
    assert across(2, (0, 1, 2), (3, 4, 5), (6,), (7,))  # 3..5 straddles, and 3 replicas fit a node
    assert not across(2, (0, 1, 2), (4, 5, 6), (3,), (7,))
    assert not across(2, (0, 1, 2, 3, 4, 5), (6,), (7,))  # wider than a node: it must span two
    assert not across(8, (0, 1), (2, 3), (4,), (5,), (6,), (7,))  # one replica per node: every merge spans nodes


def test_balance_gives_each_merged_width_its_own_speed():
    # two merged pipelines (2 and 3 replicas) and 50 unit items: 70 units over 5 replicas' speed is
    # 28 / 42; with the 3-wide group at half speed (1.5 replicas' worth) it is 40 / 30 (20 per unit)
    costs = [10.0, 10.0] + [1.0] * 50
    assert [b.load for b in balance(costs, 5, [(0, 2), (1, 3)])] == [28.0, 42.0]
    assert [b.load for b in balance(costs, 5, [(0, 2), (1, 3)], merged_speed={3: 0.5})] == [40.0, 30.0]


def test_where_every_replica_is_merged_the_merged_pipelines_end_together(monkeypatch):
    # tp2 pp2, 7 replicas: a 200K sample needs 5 merged replicas (10 GPUs, across a node's link),
    # a 90K one needs 2 (4 GPUs, in a node); no replica is left single. Balanced as if k merged
    # replicas were k replicas' speed, the 5-wide pipeline ends about 1.5x after the 2-wide one;
    # each width's speed measured, they end together at the shape's group count, and the step is
    # shorter. The 5-wide one then runs fewer, larger groups (``_pipeline``) and ends first
    reshaped_with = []
    reshape = SlimPackPlanner._reshape_slow
    monkeypatch.setattr(SlimPackPlanner, "_reshape_slow", lambda self, bins, pipes, samples, ranked, *a:
                        reshaped_with.append(ranked) or reshape(self, bins, pipes, samples, ranked, *a))
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, dp=7),
                          train=TrainConfig(max_context=262144, global_batch_tokens=1 << 20, recompute="none"),
                          planner=PlannerConfig(use_wide_merge=False, use_milp=False))
    batch = [Sample(id=0, length=200_000), Sample(id=1, length=90_000)] + [Sample(id=i, length=4096)
                                                                           for i in range(2, 152)]
    planner = SlimPackPlanner(config)
    plan = planner.plan(batch, step=0)
    check_plan(plan)
    assert sorted(len(p.replicas) for p in plan.pipelines) == [2, 5]
    assert float(plan.info["merged_speeds"]["2"]) > 1.0  # the 5-wide one is the reference (more replicas)
    # the re-balanced layout won; a pipeline slower than its score may still take another shape
    assert len(reshaped_with[-1]) > 1
    alone = {len(p.replicas): step_time(dataclasses.replace(plan, pipelines=(p,)), planner.cost)
             for p in plan.pipelines}
    shape = Shape(num_groups=plan.info["num_groups"], backward=plan.info["backward"], slicing=plan.info["slicing"],
                  lookahead=plan.info["lookahead"], head_weight=plan.info["head_weight"])
    five = next(p for p in plan.pipelines if len(p.replicas) == 5)
    as_shaped = planner._memo_pipeline(phase1.Bin(five.replicas, tuple(sorted({s.sample_id for g in five.forward
                                                                               for s in g})), 0.0), batch, shape)
    as_shaped_s = step_time(dataclasses.replace(plan, pipelines=(as_shaped,)), planner.cost)
    assert alone[2] <= as_shaped_s <= 1.06 * alone[2]
    assert len(five.forward) < shape.num_groups == len(as_shaped.forward) and alone[5] < alone[2]
    assert plan.info["step_s"] == pytest.approx(alone[2])
    uniform = balance(_costs(planner, batch), 7, [(0, 5), (1, 2)], min_ways=[5, 2] + [1] * 150)
    uniform_alone = [step_time(dataclasses.replace(plan, pipelines=(planner._memo_pipeline(b, batch, shape),)),
                               planner.cost) for b in uniform]
    assert max(uniform_alone) >= 1.4 * min(uniform_alone)
    assert simulate(plan).step_time_s <= 0.92 * max(uniform_alone)


def test_a_re_balanced_win_searches_the_shapes_again_and_keeps_the_faster_plan(monkeypatch):
    # tp2 pp2, 6 replicas: a 150K sample needs merged replicas, a 90K one too. A re-balanced layout
    # wins with the shape searched on phase 1's layout (8.07 s); searched again on the re-balanced
    # layout, two shapes score better and are built, and the faster of them (7.96 s) is kept. (The
    # 4-wide merged group straddles a node boundary on stage 1, 12 ranks per stage, and pays the
    # inter-node link there.)
    built = []
    build = SlimPackPlanner._build
    monkeypatch.setattr(SlimPackPlanner, "_build", lambda self, finalist, *a: built.append(build(self, finalist, *a))
                        or built[-1])
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, dp=6),
                          train=TrainConfig(max_context=262144, global_batch_tokens=1 << 20, recompute="none"),
                          planner=PlannerConfig(use_wide_merge=False, use_milp=False))
    batch = [Sample(id=0, length=150_000), Sample(id=1, length=90_000)] + [Sample(id=i, length=4096)
                                                                           for i in range(2, 150)]
    plan = SlimPackPlanner(config).plan(batch, step=0)
    check_plan(plan)
    assert plan.info["merged_speeds"] and plan.info["finalist"] == "searched again"
    (first, *_), *again = [b for b in built if b[0].info["merge_share"] == 1.0]  # then the shapes searched again
    assert len(again) == 2 and all(p.info["lookahead"] != first.info["lookahead"] or p.info["num_groups"]
                                   != first.info["num_groups"] for p, *_ in again)
    assert sorted(str(p.info["merge_share"]) for p, *_ in built[1 + len(again):]) == ["0.5", "None"]
    assert plan.info["step_s"] == min(p.info["step_s"] for p, *_ in again) < first.info["step_s"]
    assert simulate(plan).step_time_s == pytest.approx(plan.info["step_s"])


def _recording_builds(monkeypatch) -> list:
    """(finalist, (plan, fits, lead)) of every finalist the planner builds, in order."""
    built = []
    build = SlimPackPlanner._build
    monkeypatch.setattr(SlimPackPlanner, "_build", lambda self, finalist, *a: built.append(
        (finalist, build(self, finalist, *a))) or built[-1][1])
    return built


def _tp2_pp2_dp8_at_256k(recompute: str):
    return build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, dp=8),
                        train=TrainConfig(max_context=262144, global_batch_tokens=2 << 20, recompute=recompute),
                        planner=PlannerConfig(use_wide_merge=False, use_milp=False))


def test_every_merge_shares_best_is_built_and_the_fastest_plan_kept(monkeypatch):
    # cpython at 256K on tp2 pp2 dp8 (2M-token batch, selective recomputation): merging the 57K
    # document (share 1.0) scores best, 7.55 s, and builds 7.70 s, as its score reads the most
    # loaded pipelines only; phase 1's layout without merges scores 7.69 s and builds 7.69 s. Both
    # are built, on every step, and the faster plan is kept; the seed stays the best score's shape
    built = _recording_builds(monkeypatch)
    config = _tp2_pp2_dp8_at_256k("selective")
    planner = SlimPackPlanner(config)
    batches = stream_batches(load_dataset("cpython"), config, 2)
    plan = planner.plan(batches[0], step=0)
    check_plan(plan)
    (merged, (merged_plan, *_)), (unmerged, (unmerged_plan, *_)) = built
    assert (merged.merge_share, merged.num_merged, unmerged.merge_share, unmerged.num_merged) == (1.0, 1, None, 0)
    assert merged.score[1] < unmerged.score[1] and unmerged_plan.info["step_s"] < merged_plan.info["step_s"]
    assert plan.info["finalists"] == 2 and plan.info["finalist"] == "merge share None"
    assert simulate(plan).step_time_s == pytest.approx(unmerged_plan.info["step_s"])
    assert planner._seed == merged.shape  # the next step searches around the best score's shape, as before
    built.clear()
    seeded = planner.plan(batches[1], step=1)
    assert seeded.info["search"] == "seeded" and seeded.info["finalists"] == len(built) >= 2
    assert seeded.info["step_s"] == min(p.info["step_s"] for _, (p, fits, _) in built if fits)


def test_a_competitive_merge_shares_re_balanced_layout_is_searched_again(monkeypatch):
    # wikipedia at 256K on tp2 pp2 dp8 (2M-token batch, no recomputation): share 1.0 scores best,
    # 7.056 s, on phase 1's layout; share 0.5's best is a re-balanced layout scoring 7.059 s that
    # builds within 1% of the fastest, and its shapes searched again there give 51 groups, which
    # score 6.89 s and build 6.98 s: the plan kept. Before, only the best score's layout was searched
    # again, and the plan stepped 7.056 s
    built = _recording_builds(monkeypatch)
    config = _tp2_pp2_dp8_at_256k("none")
    planner = SlimPackPlanner(config)
    plan = planner.plan(stream_batches(load_dataset("wikipedia"), config, 1)[0], step=0)
    check_plan(plan)
    (best, (best_plan, *_)), *_, (share, (share_plan, *_)), (again, (again_plan, *_)) = built
    assert (best.merge_share, best.merged_speeds) == (1.0, {})
    assert share.merge_share == again.merge_share == 0.5 and share.merged_speeds and again.bins is share.bins
    assert best.score[1] < share.score[1] and again.score[1] < share.score[1] and again.shape != share.shape
    assert plan.info["candidate"] == "slimpack" and plan.info["finalist"] == "merge share 0.5 searched again"
    assert plan.info["step_s"] == again_plan.info["step_s"] < min(best_plan.info["step_s"], share_plan.info["step_s"])
    assert simulate(plan).step_time_s == pytest.approx(plan.info["step_s"])
    assert planner._seed == best.shape  # the search's own finalist, as before


def test_a_re_balanced_win_is_searched_afresh_on_a_full_search_step_only(monkeypatch):
    # the 6-replica batch above: step 0 (a full search) searches the re-balanced winner's layout
    # around its shape and afresh; step 1 (seeded by step 0's winner) only around its shape
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, dp=6),
                          train=TrainConfig(max_context=262144, global_batch_tokens=1 << 20, recompute="none"),
                          planner=PlannerConfig(use_wide_merge=False, use_milp=False))
    batch = [Sample(id=0, length=150_000), Sample(id=1, length=90_000)] + [Sample(id=i, length=4096)
                                                                           for i in range(2, 150)]
    calls = []  # (the layout searched, the seed)
    search = SlimPackPlanner._search
    monkeypatch.setattr(SlimPackPlanner, "_search", lambda self, bins, samples, seed: calls.append(
        (tuple((b.replicas, b.items) for b in bins), seed)) or search(self, bins, samples, seed))
    planner = SlimPackPlanner(config)
    plan = planner.plan(batch, step=0)
    *phase1, (around_bins, around), (fresh_bins, fresh) = calls
    assert plan.info["merged_speeds"] and all(seed is None for _, seed in phase1)
    assert around_bins == fresh_bins and around is not None and fresh is None
    assert all(bins != around_bins for bins, _ in phase1)  # the re-balanced layout, not phase 1's
    calls.clear()
    seeded = planner.plan([dataclasses.replace(s, id=s.id + 1000) for s in batch], step=1)
    assert seeded.info["search"] == "seeded" and seeded.info["merged_speeds"]
    assert all(seed is not None for _, seed in calls)


def _costs(planner: SlimPackPlanner, batch: list[Sample]) -> list[float]:
    """Phase 1's per-sample costs, as the planner computes them."""
    forward, backward = planner._slice_costs(0.0)
    lengths = np.array([s.length for s in batch], dtype=np.float64)
    return (forward(lengths, 0.0) + backward(lengths, 0.0)).tolist()


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.floats(0.1, 50.0), min_size=2, max_size=40), dp=st.integers(2, 8),
       needs=st.lists(st.sampled_from((1, 1, 1, 2, 3)), min_size=40, max_size=40),
       share=st.sampled_from((None, 0.5, 1.0, 2.0)),
       speeds=st.dictionaries(st.integers(2, 8), st.floats(0.2, 1.5), max_size=4))
@example(costs=[2.0, 1.0, 1.0, 1.0, 1.0], dp=7, needs=[2, 3, 1, 1, 2] + [1] * 35, share=1.0,
         speeds={3: 1 / 3})  # every pipeline as fast as one replica: one heap put an item needing 2 on 1
@example(costs=[3.0, 1.0, 1.0, 1.0, 2.0], dp=6, needs=[2, 3, 1, 1, 2] + [1] * 35, share=1.0,
         speeds={2: 1.0, 3: 1 / 3})  # the 3-wide pipeline's heap topped by a single replica: no pipeline found
def test_balance_puts_every_item_on_a_pipeline_wide_enough_for_it(costs, dp, needs, share, speeds):
    min_ways = [min(n, dp) for n in needs[:len(costs)]]
    merges = plan_merges(costs, dp, merge_share=share, min_ways=min_ways) if share else []
    bins = balance(costs, dp, merges, merged_speed=speeds, min_ways=min_ways)
    assert sorted(r for b in bins for r in b.replicas) == list(range(dp))
    assert sorted(i for b in bins for i in b.items) == list(range(len(costs)))
    widest = max(len(b.replicas) for b in bins)
    for b in bins:
        for item in b.items:
            assert len(b.replicas) >= min(min_ways[item], widest)

@settings(max_examples=80, deadline=None)
@given(costs=st.lists(st.integers(1, 6).map(float), min_size=2, max_size=40), dp=st.integers(3, 8),
       needs=st.lists(st.sampled_from((1, 1, 1, 2, 3)), min_size=40, max_size=40),
       speeds=st.dictionaries(st.integers(2, 8), st.sampled_from((1 / 3, 0.5, 0.75, 1.0, 1.25)), max_size=4))
def test_balance_places_each_item_as_the_spelled_out_rule_does(costs, dp, needs, speeds):
    """Heaviest first, each item to the bin (of those wide enough) that ends least loaded per unit
    of speed, the lower bin of equals; then the same improving moves. Small integer costs make ties,
    and speeds of 1/3 and 1/2 make merged pipelines as fast as a single replica."""
    min_ways = [min(n, dp) for n in needs[:len(costs)]]
    merges = plan_merges(costs, dp, merge_share=1.0, min_ways=min_ways)
    ways = [k for _, k in merges] + [1] * (dp - sum(k for _, k in merges))
    width = [k * speeds.get(k, 1.0) for k in ways]
    need = [min(n, max(ways)) for n in min_ways]
    members = [[i] for i, _ in merges] + [[] for _ in range(len(ways) - len(merges))]
    loads = [costs[i] for i, _ in merges] + [0.0] * (len(ways) - len(merges))
    merged = {i for i, _ in merges}
    for item in sorted((i for i in range(len(costs)) if i not in merged), key=lambda i: (-costs[i], i)):
        target = min((b for b in range(len(ways)) if ways[b] >= need[item]),
                     key=lambda b: ((loads[b] + costs[item]) / width[b], b))
        members[target].append(item)
        loads[target] += costs[item]
    phase1._improve(costs, members, loads, width, merged, need, ways)
    bins = balance(costs, dp, merges, merged_speed=speeds, min_ways=min_ways)
    assert [list(b.items) for b in bins] == members


def test_dp_merge_runs_an_outlier_with_context_parallelism():
    config = _config(pp=2, dp=4, context=131072)
    batch = [Sample(id=0, length=131072)] + [Sample(id=i, length=2048) for i in range(1, 120)]
    plan = make_planner("slimpack", config).plan(batch, step=0)
    check_plan(plan)
    merged = [p for p in plan.pipelines if len(p.replicas) > 1]
    assert merged and merged[0].cp == len(merged[0].replicas)
    assert plan.info["merged_pipelines"] >= 1
    off = make_planner("slimpack", dataclasses.replace(config, planner=PlannerConfig(use_dp_merge=False)))
    plan_off = off.plan(batch, step=0)
    assert all(len(p.replicas) == 1 for p in plan_off.pipelines)
    assert simulate(plan).step_time_s < simulate(plan_off).step_time_s



def test_more_memory_bound_outliers_than_merged_pipelines_still_fit():
    # tp2 pp2, no recomputation: one pipeline holds about 58K tokens of a sample, three merged
    # replicas about 145K. Five 128K samples on four replicas: one gets three replicas of its own,
    # the others cannot, and share that merged pipeline instead of overflowing the single replica
    # (where balancing by cost alone would put the fourth)
    # (with the whole batch on merged replicas off: memory is tight here, and that plan wins)
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, dp=4),
                          train=TrainConfig(max_context=131072, global_batch_tokens=1 << 20, recompute="none"),
                          planner=PlannerConfig(use_wide_merge=False))
    batch = [Sample(id=i, length=131072) for i in range(5)] + [Sample(id=i, length=4096) for i in range(5, 60)]
    plan = make_planner("slimpack", config).plan(batch, step=0)
    check_plan(plan)
    assert not simulate(plan).oom
    holding = {s.sample_id: p for p in plan.pipelines for g in p.forward for s in g}
    assert all(len(holding[i].replicas) == 3 for i in range(5))


def test_a_pipeline_slower_than_its_shapes_score_is_rebuilt_with_another_shape():
    config = _config(pp=2, dp=2, context=32768)
    planner = SlimPackPlanner(config)
    batch = [Sample(id=i, length=n) for i, n in enumerate([30000, 20000, 9000, 7000] + [1500] * 40)]
    planner.plan(batch, step=0)  # the planner keeps the step's batch for building pipelines
    bins = balance([float(s.length) for s in batch], 2, [])
    good = Shape(num_groups=8, backward=SYMMETRIC, slicing=True)
    slow = Shape(num_groups=1, backward=SYMMETRIC, slicing=False)  # one group: no pipelining at all
    pipes = [planner._memo_pipeline(bins[0], batch, good), planner._memo_pipeline(bins[1], batch, slow)]
    times = [planner._simulate([p])[1] for p in pipes]
    assert times[1] > 1.3 * times[0]
    out, changed, kept_times = planner._reshape_slow(bins, pipes, batch, [slow, good], expected_s=times[0])
    assert changed == 1 and out[0] is pipes[0]  # within its score: kept as is
    assert kept_times[0] == times[0] and planner._simulate([out[1]])[1] == kept_times[1] < times[1]


def test_candidates_given_up_early_leave_the_ranks_the_plan_reads_unchanged(monkeypatch):
    config = _config(pp=4, dp=4, context=65536, use_milp=False)
    lengths = [65536, 50000, 40000, 30000] + [int(300 + (i * 7919) % 9000) for i in range(400)]
    batch = [Sample(id=i, length=n) for i, n in enumerate(lengths)]

    def search(planner: SlimPackPlanner) -> dict:
        planner.plan(batch, step=0)  # the planner keeps the step's batch for building pipelines
        return planner._search(balance([float(s.length) for s in batch], 4, []), batch, None)

    def top(scores: dict) -> list:
        return [(c, scores[c]) for c in sorted(scores, key=lambda c: (rank(scores[c]), c))[:EXACT_RANKS]]

    early = search(SlimPackPlanner(config))
    monkeypatch.setattr(SlimPackPlanner, "_give_up_at", staticmethod(lambda scores, shape: float("inf")))
    full = search(SlimPackPlanner(config))
    assert early.keys() == full.keys()
    given_up = [c for c in early if early[c] != full[c]]
    assert given_up  # some were given up: their scores are lower bounds
    assert all(early[c][1] <= full[c][1] for c in given_up)
    assert top(early) == top(full)  # the same shapes, bit for bit the same scores

def test_asymmetric_backward_groups_are_balanced_on_backward_cost(monkeypatch):
    config = _config(pp=4, dp=1, context=65536, use_milp=False)
    batch = [Sample(id=0, length=65536)] + [Sample(id=i, length=1500 + 37 * i) for i in range(1, 200)]
    # SlimPack's own plan: on this batch its slice-level 1F1B candidate simulates faster and would replace it
    monkeypatch.setattr(candidates, "sliced_sequence_plans", lambda *args, **kwargs: [])
    plan = make_planner("slimpack", config).plan(batch, step=0)
    result = simulate(plan)
    backward = result.backward_group_times_s[0]
    # the simulator charges a backward group per cell (one per forward group it draws slices from),
    # which the planner's additive balance does not see: groups of many cells run up to ~16% over
    assert max(backward) / (sum(backward) / len(backward)) < 1.2
    assert not plan.pipelines[0].symmetric
    sym = make_planner("slimpack", dataclasses.replace(config, planner=PlannerConfig(use_asymmetric=False)))
    sym_plan = sym.plan(batch, step=0)
    assert all(sorted(g) in [sorted(f) for f in sym_plan.pipelines[0].forward] for g in sym_plan.pipelines[0].backward)


def test_milp_moves_whole_samples_to_cut_overload():
    groups = [[Slice(0, 0, 10), Slice(1, 0, 10)], [Slice(2, 0, 1)], [Slice(3, 0, 1)]]
    cost = lambda s: float(s.tokens)  # noqa: E731
    result = rebalance(groups, lambda g: sum(cost(s) for s in g), cost, window=2)
    assert result.status == "improved" and result.after < result.before
    # mean 22/3: the least total overload puts the two 1-token samples together
    assert sorted(sum(s.tokens for s in g) for g in result.groups) == [2, 10, 10]
    assert result.after == pytest.approx(2 * (10 - 22 / 3))
    assert sorted(s for g in result.groups for s in g) == sorted(s for g in groups for s in g)


def test_the_milp_prints_nothing_to_stdout():
    """HiGHS prints a banner on the first solver a process makes; slimpack's output must not carry it."""
    code = ("from slimpack.plan.types import Slice\n"
            "from slimpack.strategies.slimpack.milp import rebalance\n"
            "groups = [[Slice(0, 0, 10), Slice(1, 0, 10)], [Slice(2, 0, 1)], [Slice(3, 0, 1)]]\n"
            "r = rebalance(groups, lambda g: sum(s.tokens for s in g), lambda s: s.tokens, window=2)\n"
            "print('status', r.status)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "status improved\n"


@pytest.mark.parametrize(("flag", "value"), [("use_slicing", False), ("use_asymmetric", False),
                                             ("use_dp_merge", False), ("use_milp", True)])
def test_each_ablation_switch_still_gives_valid_plans(flag, value):
    config = _config(pp=2, dp=2, context=65536, **{flag: value})
    batch = [Sample(id=i, length=n) for i, n in enumerate([65536, 40000, 3000, 800, 12000, 5000] * 4)]
    plan = make_planner("slimpack", config).plan(batch, step=0)
    check_plan(plan)
    assert simulate(plan).step_time_s > 0


def test_planning_pauses_the_cycle_collector_and_restores_its_state(monkeypatch):
    import gc

    config = _config(pp=2, dp=2, context=32768)
    batch = [Sample(id=i, length=n) for i, n in enumerate([30000, 9000] + [1500] * 20)]
    seen = []
    planner = SlimPackPlanner(config)
    original = SlimPackPlanner._plan
    monkeypatch.setattr(SlimPackPlanner, "_plan", lambda self, b, *, step: seen.append(gc.isenabled()) or original(self, b, step=step))
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            planner.plan(batch, step=0)
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
    assert seen == [False, False]
    monkeypatch.setattr(SlimPackPlanner, "_plan", lambda self, b, *, step: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        planner.plan(batch, step=1)
    assert gc.isenabled()  # restored on the way out of an error too
