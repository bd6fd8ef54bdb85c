"""Megatron-Core adapter as a pure function: plans -> sample_id_groups (round -> DPxCP rank -> ids)."""

from __future__ import annotations

import pytest

from helpers import config
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.errors import UserError
from slimpack.integrations import SlimpackCPScheduler, sample_id_groups, whole_sample_form
from slimpack.plan.check import check_plan
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice


def _plan(cfg, pipelines: list[tuple[tuple[int, ...], list[list[int]]]], lengths: dict[int, int],
          cp: int = 1) -> Plan:
    """Whole-sample pipelines given as (replicas, groups of sample ids)."""
    pipes = []
    for replicas, groups in pipelines:
        forward = tuple(tuple(Slice(i, 0, lengths[i]) for i in g) for g in groups)
        pipes.append(PipelinePlan(replicas=replicas, cp=cp * len(replicas), forward=forward, backward=forward))
    samples = tuple(Sample(id=i, length=n) for i, n in lengths.items())
    return Plan(config=cfg, strategy="hand", samples=samples, pipelines=tuple(pipes))


def test_pipelines_become_rounds_per_rank_with_cp_partners_listing_the_same_samples():
    lengths = {0: 4000, 1: 300, 2: 200, 3: 500, 4: 100, 5: 700}
    cfg = config(pp=1, dp=4, max_context=4096)
    # replicas 0 and 1 merged (CP 2) run sample 0; replicas 2 and 3 run two rounds each
    plan = _plan(cfg, [((0, 1), [[0]]), ((2,), [[1, 2], [3]]), ((3,), [[4], [5]])], lengths)
    check_plan(plan)
    assert sample_id_groups(plan) == [
        [[], [], [1, 2], [4]],   # the shorter pipeline starts one round later,
        [[0], [0], [3], [5]],    # so every rank runs something in the last round
    ]


def test_layout_cp_lists_a_sample_on_every_cp_rank_of_its_replica():
    lengths = {0: 100, 1: 50, 2: 70}
    cfg = build_config(model="llama2-7b", parallel=ParallelConfig(dp=2, cp=2),
                       train=TrainConfig(max_context=4096))
    plan = _plan(cfg, [((0,), [[0]]), ((1,), [[1, 2]])], lengths, cp=2)
    assert sample_id_groups(plan) == [[[0], [0], [1, 2], [1, 2]]]


@pytest.mark.parametrize(("build", "message"), [
    (lambda: _plan(config(pp=2, dp=1, max_context=4096), [((0,), [[0]])], {0: 10}),
     "runs without pipeline parallelism; this plan has pp=2"),
    (lambda: _plan(config(pp=1, dp=3, max_context=4096), [((0,), [[0]]), ((1, 2), [[1]])], {0: 10, 1: 20}),
     "power-of-two aligned rank blocks; a pipeline spans DPxCP ranks [1, 2]"),
])
def test_what_megatron_cannot_express_is_refused(build, message):
    with pytest.raises(UserError, match=None) as info:
        sample_id_groups(build())
    assert message in str(info.value)


def test_sliced_plans_are_refused_unless_lowered():
    cfg = config(pp=1, dp=1, max_context=4096)
    s = [Slice(0, 0, 60), Slice(0, 60, 100), Slice(1, 0, 30)]
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=((s[0],), (s[1], s[2])), backward=((s[1], s[2]), (s[0],)))
    plan = Plan(config=cfg, strategy="hand", samples=(Sample(id=0, length=100), Sample(id=1, length=30)),
                pipelines=(pipe,))
    with pytest.raises(UserError, match="has slices or asymmetric backward groups"):
        sample_id_groups(plan)
    assert sample_id_groups(plan, lower=True) == [[[0]], [[1]]]
    check_plan(whole_sample_form(plan))


def test_scheduler_is_a_drop_in_for_balanced_cp_scheduler():
    cfg = build_config(model="llama2-7b", parallel=ParallelConfig(dp=4),
                       train=TrainConfig(max_context=16384, global_batch_tokens=65536))
    # (global id, seqlen) as HybridCPDataLoaderWrapper gathers them
    seqlens = [(0, 12000), (1, 800), (2, 3000), (3, 150), (4, 9000), (5, 2200), (6, 640), (7, 5100),
               (8, 300), (9, 7000), (10, 1000), (11, 4400)]
    scheduler = SlimpackCPScheduler(cfg)
    groups, ids = scheduler.get_groups_and_subsamples(seqlens, object())
    lengths = dict(seqlens)
    assert len(groups) == len(ids) and all(len(round_) == 4 for round_ in ids)
    assert all(ids[-1][rank] for rank in range(4))  # nobody idles in the last round
    assert [[[lengths[i] for i in rank] for rank in round_] for round_ in ids] == groups
    # each sample is run by a power-of-two block of ranks (1 without DP-Merge), once
    runs: dict[int, list[int]] = {}
    for round_ in ids:
        for rank, members in enumerate(round_):
            for gid in members:
                runs.setdefault(gid, []).append(rank)
    assert sorted(runs) == list(range(12))
    for ranks in runs.values():
        size = len(ranks)
        assert size & (size - 1) == 0 and ranks == list(range(ranks[0], ranks[0] + size)) and ranks[0] % size == 0
    # deterministic: every rank computes the same schedule on its own
    assert SlimpackCPScheduler(cfg).get_groups_and_subsamples(seqlens) == (groups, ids)


def test_scheduler_needs_pp_1():
    with pytest.raises(UserError, match="needs pp=1"):
        SlimpackCPScheduler(config(pp=2, dp=2))
