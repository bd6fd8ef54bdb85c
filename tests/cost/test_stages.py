"""Uneven pipeline stages: the config carries per-chunk layer counts, the cost model and the
simulator charge them, and ``balanced_stage_layers`` finds the split that minimises the slowest stage."""

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.config import Config, ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.cost.stages import _min_max_split, balanced_stage_layers, split_gain, stage_work
from slimpack.errors import UserError
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.sim import simulate

UNEVEN = (8, 8, 9, 7)


def llama3(stage_layers=UNEVEN, **parallel) -> Config:
    return build_config(model="llama3-8b", parallel=ParallelConfig(tp=8, pp=4, stage_layers=stage_layers, **parallel),
                        train=TrainConfig(max_context=65536, recompute="none"))


def test_stage_layers_round_trip_and_default_to_even():
    config = llama3()
    assert Config.from_dict(config.to_dict()) == config
    assert config.parallel.chunk_layers(32) == UNEVEN
    assert ParallelConfig(pp=4).chunk_layers(32) == (8, 8, 8, 8)


@pytest.mark.parametrize(("stage_layers", "message"), [
    ((8, 8, 8), r"expected pp\*virtual_stages = 4"),
    ((8, 8, 8, 9), "sum to 33 layers, llama3-8b has 32"),
    ((16, 16, 0, 0), "integers >= 1"),
])
def test_bad_stage_layers_are_user_errors(stage_layers, message):
    with pytest.raises(UserError, match=message):
        llama3(stage_layers)


def test_an_uneven_layer_count_needs_stage_layers():
    with pytest.raises(UserError, match=r"give an uneven split \(--stage-layers balanced, or layers per chunk"):
        build_config(model="llama3-8b", parallel=ParallelConfig(pp=3))
    assert build_config(model="llama3-8b", parallel=ParallelConfig(pp=3, stage_layers=(11, 11, 10))).parallel.pp == 3


def test_each_chunk_is_charged_its_own_layers():
    cost = CostModel(llama3())
    tokens, prefix = np.array([4096, 1000]), np.array([0.0, 5000.0])
    for backward in (False, True):
        layer = cost.layer_time(tokens, prefix, backward=backward)
        total = float(tokens.sum())
        times = [cost.group_time(tokens, prefix, virtual_stage=v, backward=backward) for v in range(4)]
        assert times[1] == pytest.approx(8 * layer)
        assert times[2] == pytest.approx(9 * layer)
        assert times[0] == pytest.approx(8 * layer + cost.embedding_time(total, 1))
        assert times[3] == pytest.approx(7 * layer + cost.head_time(total, 1, backward))
    # parameters and kept activations follow the layers too
    per_layer = cost.model.layer_params() / 8
    assert cost.stage_params(2) - cost.stage_params(1) == pytest.approx(per_layer)
    assert cost.activation_bytes(100, virtual_stage=2) == pytest.approx(9 / 8 * cost.activation_bytes(100, virtual_stage=1))


def test_simulated_single_group_pipeline_is_the_sum_of_its_chunks():
    """One group through 4 stages: forwards down, backwards up, one P2P hop between neighbours."""
    config = llama3()
    cost = CostModel(config)
    group = (Slice(0, 0, 8192),)
    plan = Plan(config=config, strategy="test", samples=(Sample(id=0, length=8192),),
                pipelines=(PipelinePlan(replicas=(0,), cp=1, forward=(group,), backward=(group,)),))
    result = simulate(plan)
    chunk = [cost.group_time([8192], [0.0], virtual_stage=v, backward=b) for b in (False, True) for v in range(4)]
    hops = sum(cost.p2p_time(8192, from_stage=s, to_stage=s + 1) + cost.p2p_time(8192, from_stage=s + 1, to_stage=s)
               for s in range(3))
    compute_end = max(s.end_s for s in result.spans if s.kind in ("F", "B"))
    assert compute_end == pytest.approx(sum(chunk) + hops)
    by_stage = {s.stage: s.end_s - s.start_s for s in result.spans if s.kind == "F"}
    assert by_stage[2] / by_stage[1] == pytest.approx(9 / 8)


@pytest.mark.parametrize(("extras", "expected"), [
    ((0.0, 0.0, 0.0, 1.8), [8, 8, 9, 7]),   # a heavy head: the last stage gives a layer away
    ((0.0, 0.0, 0.0, 0.7), [8, 8, 8, 8]),   # a light one: the even split is already best
    ((0.1, 0.0, 2.5), [11, 12, 9]),
])
def test_min_max_split_hand_cases(extras, expected):
    layers = _min_max_split(32, extras, 1.0, minimum=1)
    assert layers == expected


@settings(max_examples=60, deadline=None)
@given(num_layers=st.integers(2, 14), extras=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=4),
       minimum=st.integers(1, 2))
def test_min_max_split_is_optimal(num_layers, extras, minimum):
    if num_layers < minimum * len(extras):
        with pytest.raises(UserError):
            _min_max_split(num_layers, extras, 1.0, minimum=minimum)
        return
    layers = _min_max_split(num_layers, extras, 1.0, minimum=minimum)
    assert sum(layers) == num_layers and min(layers) >= minimum
    best = min(max(n + e for n, e in zip(split, extras, strict=True))
               for split in itertools.product(range(minimum, num_layers + 1), repeat=len(extras))
               if sum(split) == num_layers)
    assert max(n + e for n, e in zip(layers, extras, strict=True)) == pytest.approx(best)


def test_llama3_8b_on_short_documents_moves_a_layer_off_the_last_stage():
    config = llama3(stage_layers=())
    lengths = [2048] * 64
    work = stage_work(config, lengths)
    assert work.head_s > work.layer_s  # the 128K-vocabulary head outweighs a layer
    split = balanced_stage_layers(config, lengths)
    assert split == (8, 8, 9, 7)
    even, uneven = work.stage_times((8, 8, 8, 8), pp=4), work.stage_times(split, pp=4)
    assert max(uneven) < max(even)
    assert sum(uneven) == pytest.approx(sum(even))


def test_the_pipeline_can_be_given_apart_from_the_config():
    # pp 3 does not divide llama3-8b's 32 layers, so no config of it exists without a split: the
    # split is found from a config without a pipeline (the same tp, cp and batch)
    four = llama3(stage_layers=())
    assert four.parallel.pp == 4
    flat = dataclasses.replace(four, parallel=dataclasses.replace(four.parallel, pp=1))
    three = balanced_stage_layers(flat, [2048] * 64, pp=3)
    assert sum(three) == 32 and len(three) == 3 and three[-1] < three[0]
    assert balanced_stage_layers(four, [2048] * 64) == balanced_stage_layers(flat, [2048] * 64, pp=4) == (8, 8, 9, 7)
    with pytest.raises(UserError, match="32 layers cannot give 64 pipeline stages 1 layer"):
        balanced_stage_layers(four, pp=64)


def test_split_gain_is_the_slowest_stage_balanced_over_the_configs_own():
    config = llama3(stage_layers=())
    work = stage_work(config, [2048] * 64)
    split, ratio = split_gain(config, [2048] * 64)
    assert split == (8, 8, 9, 7)
    assert ratio == pytest.approx(max(work.stage_times(split, pp=4)) / max(work.stage_times((8, 8, 8, 8), pp=4)))
    assert ratio < 0.99
    assert split_gain(llama3(stage_layers=split), [2048] * 64) == (split, 1.0)


def test_interleaved_split_spreads_each_stage_over_its_chunks():
    config = build_config(model="qwen2.5-7b", parallel=ParallelConfig(pp=2, virtual_stages=2),
                          train=TrainConfig(max_context=4096))
    split = balanced_stage_layers(config, [1024] * 8)
    assert len(split) == 4 and sum(split) == 28
    assert dataclasses.replace(config.parallel, stage_layers=split).chunk_layers(28) == split
    work = stage_work(config, [1024] * 8)
    # stage 0 = chunks 0 and 2, stage 1 = chunks 1 and 3 (which holds the head): stage 1 has fewer layers
    assert split[1] + split[3] < split[0] + split[2]
    assert max(work.stage_times(split, pp=2)) <= max(work.stage_times((7, 7, 7, 7), pp=2))
