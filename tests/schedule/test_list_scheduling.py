"""The list-scheduled order (``schedule.list_scheduling``): hand-traced on a small pipeline, bounded
by its memory cap, and deadlock-free on random sliced, asymmetric plans under interleaving."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import UniformCost, config
from random_plans import pipelines_of
from slimpack.plan.check import check_plan
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.schedule import order_to_text
from slimpack.schedule.dag import build_graph, topological_order
from slimpack.schedule.list_scheduling import list_schedule
from slimpack.sim import simulate


def _uniform(forward, backward, pp, chunks, *, t_f=1.0, t_b=2.0, cap=math.inf):
    groups = {"F": forward, "B": backward}
    return list_schedule(forward, backward, pp=pp, chunks=chunks,
                         durations=lambda kind, vstage: [t_f if kind == "F" else t_b] * len(groups[kind]),
                         kept_bytes=lambda kind, vstage: [1.0] * len(groups[kind]), cap_bytes=[cap] * pp)


def _whole(n):
    return tuple((Slice(i, 0, 1),) for i in range(n))


def test_two_groups_two_stages_two_chunks_hand_traced():
    """F = 1 s, B = 2 s per chunk. Device 0 holds virtual stages 0 and 2, device 1 holds 1 and 3.
    Traced by hand: at t = 4 device 1 may run F1 or B0 on stage 3 and takes the backward; the last
    backward ends at 15 s (12 s of work per device, 3 s idle)."""
    groups = _whole(2)
    order = _uniform(groups, groups, 2, 2)
    assert order_to_text(order) == ["F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1", "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1"]
    cfg = config(pp=2, vpp=2)
    plan = Plan(config=cfg, strategy="test", samples=tuple(Sample(id=i, length=1) for i in range(2)),
                pipelines=(PipelinePlan(replicas=(0,), cp=1, forward=groups, backward=groups, order=order),))
    assert simulate(plan, UniformCost(cfg, 1.0, 2.0)).step_time_s == 15.0


def _max_live(order, pp):
    """Per device, the most groups held at once along its order (one unit per forward on a chunk)."""
    most = []
    for actions in order:
        live = peak = 0
        for action in actions:
            live += 1 if action.kind == "F" else -1
            peak = max(peak, live)
        most.append(peak)
    return most


def test_the_memory_cap_bounds_forwards_in_flight():
    """Each group must pass both chunks of a device before its backward frees one of them, so a
    device needs room for 2 groups; with that cap no device holds more, without it device 0 runs
    all 6 forwards of chunk 0 before any backward."""
    groups = _whole(6)
    assert _max_live(_uniform(groups, groups, 2, 2, cap=2.0), 2) == [2, 2]
    assert _max_live(_uniform(groups, groups, 2, 2), 2)[0] > 2


def test_a_cap_too_small_for_anything_still_gives_a_complete_order():
    groups = _whole(3)
    order = _uniform(groups, groups, 2, 2, cap=0.0)
    graph = build_graph(groups, groups, order, pp=2, chunks=2)
    assert len(topological_order(graph)) == 3 * 2 * 2 * 2


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pp=st.sampled_from([1, 2, 4]), chunks=st.sampled_from([2, 4]),
       lengths=st.lists(st.integers(2, 5000), min_size=1, max_size=6))
def test_random_sliced_asymmetric_plans_interleave_without_deadlock(data, pp, chunks, lengths):
    samples = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    pipe = data.draw(pipelines_of(samples, (0,), 1))
    order = _uniform(pipe.forward, pipe.backward, pp, chunks, cap=data.draw(st.sampled_from([0.0, 3.0, math.inf])))
    plan = Plan(config=config(pp=pp, vpp=chunks, max_context=5000), strategy="test", samples=tuple(samples),
                pipelines=(PipelinePlan(replicas=(0,), cp=1, forward=pipe.forward, backward=pipe.backward,
                                        order=order),))
    check_plan(plan)  # every action once, each stage's order consistent with the data dependencies
