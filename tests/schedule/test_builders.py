import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import UniformCost, config, one_sample_per_group_plan
from slimpack.errors import ScheduleError
from slimpack.plan.types import Action, PipelinePlan, Plan, Sample, Slice
from slimpack.schedule import (
    backward_needs,
    chain_lookahead,
    dependency_aware,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    order_to_text,
)
from slimpack.schedule.dag import build_graph, topological_order
from slimpack.sim import simulate


def test_golden_1f1b_and_gpipe():
    assert order_to_text(one_f_one_b(5, 3)) == [
        "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4",
    ]
    assert order_to_text(gpipe(2, 2)) == ["F0 F1 B0 B1", "F0 F1 B0 B1"]


def test_golden_interleaved():
    # 4 groups, 2 stages, 2 chunks: Megatron's warm-up is (p-s-1)*2 + (v-1)*p
    assert order_to_text(interleaved_1f1b(4, 2, 2)) == [
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3",
        "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3",
    ]


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 5), (4, 4), (4, 9), (8, 3), (8, 64)])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_closed_form_step_bubble_and_in_flight(p, m, schedule):
    cfg = config(pp=p)
    order = gpipe(m, p) if schedule == "gpipe" else None
    plan = one_sample_per_group_plan(cfg, m, order=order)
    result = simulate(plan, UniformCost(cfg, 1.0, 2.0))
    assert result.step_time_s == pytest.approx((m + p - 1) * 3.0)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert result.efficiency == pytest.approx(m / (m + p - 1))  # ideal: 3 s of work per group and stage
    stage0 = next(mem for mem in result.memory if mem.stage == 0)
    assert stage0.peak_bytes == (min(p, m) if schedule == "1f1b" else m)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_a_replica_with_no_samples_only_joins_the_all_reduce(p):
    # more replicas than samples: replica 1's pipeline has no groups; the step is replica 0's
    # closed-form 1F1B step, and replica 1's devices run nothing and hold nothing
    cfg = config(pp=p, dp=2)
    busy = one_sample_per_group_plan(cfg, 3)
    empty = PipelinePlan(replicas=(1,), cp=1, forward=(), backward=(), order=((),) * p)
    plan = dataclasses.replace(busy, pipelines=(busy.pipelines[0], empty))
    result = simulate(plan, UniformCost(cfg, 1.0, 2.0))
    assert result.step_time_s == pytest.approx((3 + p - 1) * 3.0)
    assert [s for s in result.spans if s.pipeline == 1 and s.kind in "FB"] == []
    assert all(mem.peak_bytes == 0.0 for mem in result.memory if mem.pipeline == 1)
    assert max(mem.peak_bytes for mem in result.memory if mem.pipeline == 0) == min(p, 3)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 4, 8), (4, 5, 12)])
def test_interleaved_matches_published_bubble(p, v, m):
    # Narayanan et al. SC'21 §2.2.2: bubble time (p-1)(t_f+t_b)/v per stage, so the step is
    # (m + (p-1)/v)(t_f+t_b) with t_f, t_b the whole-stage times (each chunk takes 1/v of them).
    cfg = config(pp=p, vpp=v, model="llama2-70b" if v == 5 else "llama2-7b")
    plan = one_sample_per_group_plan(cfg, m)
    result = simulate(plan, UniformCost(cfg, 1.0 / v, 2.0 / v))
    assert result.step_time_s == pytest.approx((m + (p - 1) / v) * 3.0)


def _chain_plan(cfg, lengths_and_cuts, backward_groups):
    samples, forward = [], []
    for sid, cuts in enumerate(lengths_and_cuts):
        samples.append(Sample(id=sid, length=cuts[-1]))
        prev = 0
        for c in cuts:
            forward.append((Slice(sid, prev, c),))
            prev = c
    backward = tuple(tuple(forward[i][0] for i in idx) for idx in backward_groups)
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=tuple(forward), backward=backward)
    return Plan(config=cfg, strategy="test", samples=tuple(samples), pipelines=(pipe,))


def test_backward_needs_of_a_chain():
    # sample 0 cut in 3 slices (forward groups 0, 1, 2), sample 1 whole (group 3);
    # backward: [slice 2 of s0], [slice 1 + slice 0 of s0], [s1]
    cfg = config(pp=2)
    plan = _chain_plan(cfg, [(10, 20, 30), (5,)], [(2,), (0, 1), (3,)])
    pipe = plan.pipelines[0]
    assert backward_needs(pipe.forward, pipe.backward) == [3, 3, 4]



@pytest.mark.parametrize(("pp", "chains", "n"), [(2, 3, 4), (4, 2, 8), (4, 5, 4), (4, 3, 6), (8, 2, 16)])
def test_the_chain_lookahead_keeps_1f1b_closed_form_over_sliced_samples(pp, chains, n):
    # ``chains`` samples each cut into n equal slices, one slice per group, backward the same groups
    # (last slice first): with the chain look-ahead the order never waits for a chain, and the step
    # is 1F1B's closed form (groups + pp - 1) * (t_f + t_b); without it, it waits at every chain.
    # (Chains shorter than pp miss the form by a little: the look-ahead adds to the chain's floor.)
    cfg = config(pp=pp)
    groups = [[i + c * n for i in reversed(range(n))] for c in range(chains)]
    plan = _chain_plan(cfg, [tuple(range(1, n + 1))] * chains, [(g,) for chain in groups for g in chain])
    pipe = plan.pipelines[0]
    need = backward_needs(pipe.forward, pipe.backward)
    assert chain_lookahead(need) == n - 1
    steps = {}
    for lookahead in (0, chain_lookahead(need)):
        order = dependency_aware(need, num_forward=chains * n, pp=pp, lookahead=lookahead)
        plan = dataclasses.replace(plan, pipelines=(dataclasses.replace(pipe, order=order),))
        steps[lookahead] = simulate(plan, UniformCost(cfg, 1.0, 2.0)).step_time_s
    assert steps[n - 1] == pytest.approx((chains * n + pp - 1) * 3.0)
    assert steps[0] > steps[n - 1] + 1.0

@given(st.integers(1, 6), st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 3),
       st.booleans(), st.data())
def test_dependency_aware_never_deadlocks(pp, chain_lengths, lookahead, capped, data):
    """Random chains of slices with random contiguous backward regroupings in reverse order."""
    cfg = config(pp=pp if 32 % pp == 0 else 2)
    cuts = [tuple(range(1, n + 1)) for n in chain_lengths]
    num_forward = sum(chain_lengths)
    # backward visits forward groups in an order that is reverse within each chain, chains interleaved
    remaining = {c: list(range(sum(chain_lengths[:c]), sum(chain_lengths[:c + 1])))[::-1]
                 for c in range(len(chain_lengths))}
    sequence = []
    while any(remaining.values()):
        chain = data.draw(st.sampled_from([c for c, r in remaining.items() if r]))
        sequence.append(remaining[chain].pop(0))
    splits = sorted(data.draw(st.sets(st.integers(1, num_forward - 1), max_size=num_forward)) if num_forward > 1 else [])
    bounds = [0, *splits, num_forward]
    # within a group, slices are listed in data order (the runtime runs later slices first in backward)
    groups = [tuple(sorted(sequence[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]
    plan = _chain_plan(cfg, cuts, groups)
    pipe = plan.pipelines[0]
    need = backward_needs(pipe.forward, pipe.backward)
    sizes = [1.0] * num_forward
    order = dependency_aware(need, num_forward=num_forward, pp=cfg.parallel.pp, lookahead=lookahead,
                             forward_tokens=sizes if capped else None,
                             backward_tokens=[float(len(g)) for g in pipe.backward] if capped else None,
                             cap_tokens=[1.0 + s for s in range(cfg.parallel.pp)] if capped else None)
    graph = build_graph(pipe.forward, pipe.backward, order, pp=cfg.parallel.pp, chunks=1)
    assert len(topological_order(graph)) == (num_forward + len(groups)) * cfg.parallel.pp


def test_an_order_that_deadlocks_is_rejected():
    cfg = config(pp=2)
    plan = one_sample_per_group_plan(cfg, 2)
    bad = ((Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)),
           (Action("F", 1), Action("F", 0), Action("B", 0), Action("B", 1)))
    # stage 1 wants F1 first, stage 0 only sends F1 after B0, which needs stage 1's B0: a cycle
    with pytest.raises(ScheduleError, match="deadlocks"):
        topological_order(build_graph(plan.pipelines[0].forward, plan.pipelines[0].backward, bad, pp=2, chunks=1))
    missing = (bad[0], bad[1][:-1])
    with pytest.raises(ScheduleError, match="never runs B1"):
        build_graph(plan.pipelines[0].forward, plan.pipelines[0].backward, missing, pp=2, chunks=1)
