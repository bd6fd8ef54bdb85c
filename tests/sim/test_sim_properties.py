"""Invariants of the simulated timeline over random plans (real CostModel, small pp/dp)."""

from collections import defaultdict

import pytest
from hypothesis import given, settings

from random_plans import plans
from slimpack.cost import CostModel
from slimpack.plan.check import schedule_graph
from slimpack.schedule.dag import P2P
from slimpack.sim import simulate

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(plans())
def test_no_two_actions_overlap_on_a_device(plan):
    result = simulate(plan)
    by_device = defaultdict(list)
    for span in result.spans:
        assert span.end_s >= span.start_s >= 0.0
        by_device[(span.pipeline, span.stage)].append(span)
    assert len(by_device) == len(plan.pipelines) * plan.config.parallel.pp
    for spans in by_device.values():
        spans.sort(key=lambda s: (s.start_s, s.end_s))
        for before, after in zip(spans, spans[1:], strict=False):
            assert after.start_s >= before.end_s, (before, after)


@SETTINGS
@given(plans())
def test_every_dependency_is_respected(plan):
    cost = CostModel(plan.config)
    result = simulate(plan, cost)
    for p, pipe in enumerate(plan.pipelines):
        graph, _ = schedule_graph(pipe, plan.config)
        span_of = {(s.stage, s.kind, s.group, s.chunk): s for s in result.spans
                   if s.pipeline == p and s.kind in ("F", "B")}
        nodes = graph.nodes()
        assert len(span_of) == len(nodes)  # every action ran, once
        for node, (device, action) in enumerate(nodes):
            span = span_of[(device, *action)]
            for pred, kind in graph.preds(node):
                pred_device, pred_action = nodes[pred]
                ready = span_of[(pred_device, *pred_action)].end_s
                if kind == P2P:  # activations or gradients travel to the next device first
                    ready += cost.p2p_time(span.tokens, from_stage=pred_device, to_stage=device, cp=pipe.cp,
                                           replicas=pipe.replicas)
                assert span.start_s >= ready, (p, action, device, pred_action, pred_device)
    # a stage's gradient sync starts once that stage is done on every pipeline (the DP all-reduce)
    last_compute = defaultdict(float)
    for s in result.spans:
        if s.kind in ("F", "B"):
            last_compute[s.stage] = max(last_compute[s.stage], s.end_s)
    for s in result.spans:
        if s.kind == "sync":
            assert s.start_s >= last_compute[s.stage]


@SETTINGS
@given(plans())
def test_step_is_never_faster_than_ideal(plan):
    result = simulate(plan)
    assert result.step_time_s >= result.ideal_time_s > 0.0
    assert 0.0 < result.efficiency <= 1.0
    assert 0.0 <= result.bubble_fraction < 1.0
    assert result.step_time_s == max(s.end_s for s in result.spans)
    scheduled = set(s.id for s in plan.samples) - set(plan.deferred)
    assert result.num_tokens == sum(s.length for s in plan.samples if s.id in scheduled)


@SETTINGS
@given(plans())
def test_every_activation_is_freed(plan):
    result = simulate(plan)
    for memory in result.memory:
        assert memory.times_s == tuple(sorted(memory.times_s))
        assert memory.peak_bytes >= memory.model_state_bytes
        assert memory.live_bytes[-1] == pytest.approx(memory.model_state_bytes, rel=1e-9)
    peaks = [max(m.peak_bytes for m in result.memory if m.stage == s) for s in range(plan.config.parallel.pp)]
    assert list(result.peak_memory_bytes) == peaks
    assert result.oom == any(p > result.memory_capacity_bytes for p in peaks)


@settings(max_examples=30, deadline=None)
@given(plans())
def test_same_plan_same_result(plan):
    first, second = simulate(plan), simulate(plan, CostModel(plan.config))
    assert first.summary() == second.summary()
    assert first.spans == second.spans
    assert first.memory == second.memory
