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


def test_a_replica_with_fewer_samples_than_the_count_gets_padding_micro_batches_at_the_end():
    # replica 1 holds 2 samples in one group: split to [4] [5], then one padding micro-batch; the
    # count stays replica 0's 3 groups, none merged
    form = equal_count_form(_plan(((4, 5),)))
    check_plan(form)
    assert [[[s.sample_id for s in g] for g in p.forward] for p in form.pipelines] == [
        [[1], [2], [3]], [[4], [5]]]  # the plan keeps only real groups (the simulator has no empty one)
    assert rank_micro_batches(_plan(((4, 5),))) == [((1,), (2,), (3,)), ((4,), (5,), ())]
    # a replica with one sample: it and two padding micro-batches
    assert rank_micro_batches(_plan(((6,),))) == [((1,), (2,), (3,)), ((6,), (), ())]
    assert equal_count_form(_plan(((6,),))) == _plan(((6,),))  # nothing to split: unchanged


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
def test_equal_counts_split_never_merge_and_pad_only_at_the_end(drawn):
    replicas, lengths = drawn
    cfg = config(pp=1, dp=len(replicas), max_context=16384)
    pipes = tuple(PipelinePlan(replicas=(r,), cp=1, forward=g, backward=g) for r, g in enumerate(
        tuple(tuple(Slice(i, 0, lengths[i]) for i in group) for group in groups) for groups in replicas))
    plan = Plan(config=cfg, strategy="hand", samples=tuple(Sample(id=i, length=n) for i, n in lengths.items()),
                pipelines=pipes)
    count = max(map(len, replicas))
    got = rank_micro_batches(plan)
    check_plan(equal_count_form(plan))
    for groups, batches in zip(replicas, got, strict=True):
        assert len(batches) == count
        real = [b for b in batches if b]
        assert batches[len(real):] == ((),) * (count - len(real))  # padding only at the end
        # never merged: each real micro-batch lies inside one original group, in order
        owner = {i: k for k, group in enumerate(groups) for i in group}
        assert [i for b in real for i in b] == [i for g in groups for i in g]
        assert all(len({owner[i] for i in b}) == 1 for b in real)
        # padded only where the replica has too few samples to split further
        samples = sum(map(len, groups))
        assert len(real) == min(count, samples)
