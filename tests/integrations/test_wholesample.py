"""The equal-count form: the plan frameworks with a fixed number of micro-batches per step run."""

from __future__ import annotations

import pytest

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


def test_fewer_groups_are_split_at_half_their_tokens_until_the_counts_match():
    plan = _plan(((4, 5, 6),))  # 15000 tokens: 4+5 = 9000 reach half -> [4, 5] [6]; then [4] [5] [6]
    form = equal_count_form(plan)
    check_plan(form)
    assert [[[s.sample_id for s in g] for g in p.forward] for p in form.pipelines] == [
        [[1], [2], [3]], [[4], [5], [6]]]
    assert rank_micro_batches(plan) == [((1,), (2,), (3,)), ((4,), (5,), (6,))]
    # the simulator scores it: same tokens, one more micro-batch per step on replica 1
    assert simulate(form).num_tokens == simulate(plan).num_tokens == 21000
    assert equal_count_form(_plan(((4,), (5,), (6,)))) == _plan(((4,), (5,), (6,)))  # already equal


def test_a_replica_with_fewer_samples_than_the_others_groups_sets_the_count():
    # replica 1 holds 2 samples: every replica runs 2 micro-batches; replica 0 merges its lightest
    # adjacent pair ([1] + [2] = 3000 tokens, against [2] + [3] = 5000)
    form = equal_count_form(_plan(((4, 5),)))
    check_plan(form)
    assert rank_micro_batches(form) == [((1, 2), (3,)), ((4,), (5,))]
    # a replica with one sample: one micro-batch each
    assert rank_micro_batches(_plan(((6,),))) == [((1, 2, 3),), ((6,),)]
    with pytest.raises(UserError, match="merged into one context-parallel group"):
        plan = _plan(((4,),))
        pipes = (PipelinePlan(replicas=(0, 1), cp=1, forward=plan.pipelines[0].forward,
                              backward=plan.pipelines[0].backward),)
        equal_count_form(Plan(config=plan.config, strategy="hand", samples=plan.samples[:3], pipelines=pipes))
