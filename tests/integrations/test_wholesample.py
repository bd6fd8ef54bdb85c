"""The equal-count form: the plan frameworks with a fixed number of micro-batches per step run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import config
from slimpack.errors import UserError
from slimpack.integrations.wholesample import equal_count_form, rank_micro_batches
from slimpack.plan.check import check_plan
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.sim import simulate


def _plan(second: tuple[tuple[int, ...], ...]) -> Plan:
    """Replica 0: three groups of one sample; replica 1: the groups ``second`` (lengths 1000 * id)."""
    cfg = config(pp=2, dp=2, max_context=8192)
    ids = sorted({i for g in second for i in g} | {1, 2, 3})

    def groups(spec):
        return tuple(tuple(Slice(i, 0, 1000 * i) for i in g) for g in spec)

    pipes = (PipelinePlan(replicas=(0,), cp=1, forward=groups(((1,), (2,), (3,))), backward=groups(((1,), (2,), (3,)))),
             PipelinePlan(replicas=(1,), cp=1, forward=groups(second), backward=groups(second)))
    return Plan(config=cfg, strategy="hand", samples=tuple(Sample(id=i, length=1000 * i) for i in ids),
                pipelines=pipes)


def test_a_replica_with_fewer_groups_ends_with_padding_micro_batches():
    # replica 1 holds one group of 3 samples against replica 0's 3 groups: the count is 3, its
    # group stays whole (neither split nor merged) and two padding micro-batches follow it
    plan = _plan(((4, 5, 6),))
    assert rank_micro_batches(plan) == [((1,), (2,), (3,)), ((4, 5, 6), (), ())]
    assert equal_count_form(plan) is plan  # the plan keeps only real groups (the simulator has no empty one)
    assert simulate(equal_count_form(plan)).num_tokens == 21000
    # two samples in two groups: one padding micro-batch; equal counts: none
    assert rank_micro_batches(_plan(((4,), (5,)))) == [((1,), (2,), (3,)), ((4,), (5,), ())]
    assert rank_micro_batches(_plan(((4,), (5,), (6,)))) == [((1,), (2,), (3,)), ((4,), (5,), (6,))]
    # replica 0 is the shorter one: padding goes to it
    assert rank_micro_batches(_plan(((4,), (5,), (6,), (7,)))) == [((1,), (2,), (3,), ()), ((4,), (5,), (6,), (7,))]


def test_dp_merged_replicas_are_refused():
    with pytest.raises(UserError, match="merged into one context-parallel group"):
        plan = _plan(((4,),))
        pipes = (PipelinePlan(replicas=(0, 1), cp=1, forward=plan.pipelines[0].forward,
                              backward=plan.pipelines[0].backward),)
        equal_count_form(Plan(config=plan.config, strategy="hand", samples=plan.samples[:3], pipelines=pipes))


@st.composite
def _replica_groups(draw):
    """2-4 replicas, each 1-6 samples (ids distinct, lengths 1-9000) cut into contiguous groups."""
    replicas, next_id, lengths = [], 0, {}
    for _ in range(draw(st.integers(2, 4))):
        ids = list(range(next_id, next_id + draw(st.integers(1, 6))))
        next_id += len(ids)
        lengths.update({i: draw(st.integers(1, 9000)) for i in ids})
        cuts = sorted(draw(st.sets(st.integers(1, len(ids) - 1), max_size=len(ids) - 1))) if len(ids) > 1 else []
        bounds = [0, *cuts, len(ids)]
        replicas.append([tuple(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
    return replicas, lengths


@given(_replica_groups())
def test_equal_counts_keep_every_group_and_pad_only_at_the_end(drawn):
    replicas, lengths = drawn
    cfg = config(pp=1, dp=len(replicas), max_context=16384)
    pipes = tuple(PipelinePlan(replicas=(r,), cp=1, forward=g, backward=g) for r, g in enumerate(
        tuple(tuple(Slice(i, 0, lengths[i]) for i in group) for group in groups) for groups in replicas))
    plan = Plan(config=cfg, strategy="hand", samples=tuple(Sample(id=i, length=n) for i, n in lengths.items()),
                pipelines=pipes)
    check_plan(plan)
    count = max(map(len, replicas))
    for groups, batches in zip(replicas, rank_micro_batches(plan), strict=True):
        # the replica's own groups, in order, never merged nor split, then padding to the count
        assert batches == tuple(groups) + ((),) * (count - len(groups))
