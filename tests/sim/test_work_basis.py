"""The common work basis (one ideal for every strategy on the same documents) and per-cell charging."""

import numpy as np
import pytest

from slimpack.config import (
    EfficiencyConfig,
    ParallelConfig,
    PlannerConfig,
    TrainConfig,
    build_config,
)
from slimpack.cost import CostModel
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.sim import simulate
from slimpack.strategies import make_planner

PEAK = 989.4e12
# no fixed costs, no small-call penalty, no elementwise term: work reduces to FLOPs over rates
BARE = EfficiencyConfig(gemm_max=0.5, gemm_half_tokens=0, attention_max=0.4, attention_backward_max=0.25,
                        attention_half_tokens=0, elementwise_bandwidth=None, layer_overhead_s=0)


def _tiny_whole_document_seconds(length: int) -> float:
    """Hand-computed for the tiny model (4 layers, h 64, 4 heads, 2 KV heads of 16, f 176, V 256)."""
    linear = 2 * 64 * (64 + 2 * 32) + 2 * 64 * 64 + 2 * 3 * 64 * 176  # 92160 FLOPs per token
    pairs = length * (length + 1) / 2
    layer = 3 * linear * length / (0.5 * PEAK) + 4 * 64 * pairs * (1 / (0.4 * PEAK) + 2.5 / (0.25 * PEAK))
    head = 3 * 2 * 64 * 256 * length / (0.5 * PEAK) + length * 256 * 4 * 3 / 3.35e12
    return 4 * layer + head


def test_one_ideal_for_every_strategy_on_the_same_documents():
    config = build_config(model="tiny", parallel=ParallelConfig(pp=2, dp=2),
                          train=TrainConfig(max_context=4096, global_batch_tokens=8000),
                          efficiency=BARE, planner=PlannerConfig(use_milp=False))
    lengths = [3000, 500, 700, 2500, 1200, 60, 40]
    batch = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    ideal = sum(_tiny_whole_document_seconds(n) for n in lengths) / 4  # 4 GPUs
    results = {}
    for name in ("fixed", "bfd", "slimpack", "slimpipe"):
        plan = make_planner(name, config).plan(batch, step=0)
        # step 0, nothing deferred: the documents trained are the batch (PlannedStep.trained_document_lengths)
        results[name] = simulate(plan, document_lengths=[s.length for s in batch])
        assert results[name].ideal_time_s == pytest.approx(ideal, rel=1e-12), name
        assert results[name].efficiency == pytest.approx(ideal / results[name].step_time_s, rel=1e-12)
    # fixed cuts the 700-token document at the sequence boundary: its samples are not the documents
    assert len(make_planner("fixed", config).plan(batch, step=0).samples) > len(batch)
    # a plan's own work is at least the ideal (fixed does less attention: its own work is smaller
    # than its pieces' whole documents, so only the sliced/packed strategies are checked)
    for name in ("bfd", "slimpack", "slimpipe"):
        assert results[name].work_time_s >= results[name].ideal_time_s * (1 - 1e-9), name


def test_mfu_counts_whole_documents_at_peak():
    config = build_config(model="tiny", parallel=ParallelConfig(pp=2), train=TrainConfig(max_context=4096))
    batch = [Sample(id=0, length=3000), Sample(id=1, length=2000)]
    plan = make_planner("fixed", config).plan(batch, step=0)  # cuts document 1 at 4096
    result = simulate(plan, document_lengths=[3000, 2000])
    linear, attention_per_pair, head = 92160, 256, 2 * 64 * 256
    flops = sum(4 * (3 * linear * n + 3.5 * attention_per_pair * n * (n + 1) / 2) + 3 * head * n for n in (3000, 2000))
    assert result.mfu == pytest.approx(flops / (result.step_time_s * 2 * PEAK), rel=1e-12)


def _asymmetric_plan(config):
    # F0 holds samples 0 and 1, which go to different backward groups: two cells; F1 one cell.
    forward = ((Slice(0, 0, 1000), Slice(1, 0, 3000)), (Slice(2, 0, 500),))
    backward = ((Slice(1, 0, 3000),), (Slice(0, 0, 1000), Slice(2, 0, 500)))
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward)
    samples = tuple(Sample(id=i, length=n) for i, n in enumerate((1000, 3000, 500)))
    return Plan(config=config, strategy="hand", samples=samples, pipelines=(pipe,))


def test_a_two_cell_group_costs_two_cells():
    config = build_config(model="llama2-7b", parallel=ParallelConfig(pp=4))
    cost = CostModel(config)
    result = simulate(_asymmetric_plan(config), cost)
    assert result.forward_group_cells == ((2, 1),) and result.backward_group_cells == ((1, 2),)
    middle = 2
    one_cell = [cost.group_time([n], [0], virtual_stage=middle, backward=False) for n in (1000, 3000)]
    packed = cost.group_time([1000, 3000], [0, 0], virtual_stage=middle, backward=False)
    assert result.forward_group_times_s[0][0] == pytest.approx(sum(one_cell), rel=1e-12)
    # the second cell pays one more call's fixed costs: 8 layers x (overhead + GEMM half-size term)
    assert sum(one_cell) - packed == pytest.approx(cost.group_constant(backward=False), rel=1e-9)
    backward_b1 = sum(cost.group_time([n], [0], virtual_stage=middle, backward=True) for n in (1000, 500))
    assert result.backward_group_times_s[0][1] == pytest.approx(backward_b1, rel=1e-12)
    span = next(s for s in result.spans if s.kind == "F" and s.group == 0 and s.stage == 1)
    assert span.end_s - span.start_s == pytest.approx(sum(one_cell), rel=1e-12)


def test_a_merged_pipeline_that_straddles_a_node_boundary_runs_its_cp_ring_across_nodes():
    # tp 4, dp 4, 8-GPU nodes: a DP-Merge pipeline on replicas (0, 1) is ranks 0..7, one node; on
    # (1, 2) ranks 4..11, two nodes. The same groups then take longer by the slower cp ring.
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=4, dp=4),
                          train=TrainConfig(max_context=16384, global_batch_tokens=32768))
    cost = CostModel(config)
    samples = tuple(Sample(id=i, length=8192) for i in range(4))
    group = ((Slice(0, 0, 8192), Slice(1, 0, 8192)),)

    def step(merged: tuple[int, ...]) -> float:
        single = [r for r in range(4) if r not in merged]
        pipes = (PipelinePlan(replicas=merged, cp=2, forward=group, backward=group),
                 *(PipelinePlan(replicas=(r,), cp=1, forward=((Slice(s, 0, 8192),),), backward=((Slice(s, 0, 8192),),))
                   for r, s in zip(single, (2, 3), strict=True)))
        return simulate(Plan(config=config, strategy="hand", samples=samples, pipelines=pipes), cost).spans

    def merged_busy(spans) -> float:
        return sum(s.end_s - s.start_s for s in spans if s.pipeline == 0 and s.kind in "FB")

    sums = cost.group_sums([8192, 8192], [0, 0], 2)
    expected = sum(cost.cells_time(np.array([sums[0]]), np.array([sums[1]]), virtual_stage=0, backward=b, cp=2,
                                   cross_node=True)[0]
                   - cost.cells_time(np.array([sums[0]]), np.array([sums[1]]), virtual_stage=0, backward=b, cp=2,
                                     cross_node=False)[0] for b in (False, True))
    assert expected > 0
    assert merged_busy(step((1, 2))) - merged_busy(step((0, 1))) == pytest.approx(expected, rel=1e-9)
