"""``slimpack.tune``: the layouts it enumerates, the floors it prunes by, and the best it finds
(the same as simulating every layout)."""

from collections import Counter

import pytest

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.errors import UserError
from slimpack.sim import simulate
from slimpack.strategies import make_planner
from slimpack.strategies.stream import stream_batches
from slimpack.tune import tune
from slimpack.tune.bounds import memory_floor_bytes, time_floor_s
from slimpack.tune.layouts import RECOMPUTE, layouts

BASE = build_config(model="llama2-7b", train=TrainConfig(max_context=16384, global_batch_tokens=2**17))
WIKIPEDIA = load_dataset("wikipedia")


def test_layouts_of_8_gpus_hand_counted():
    skipped = Counter()
    found = list(layouts(BASE, 8, [4096] * 4, skipped))
    # powers of two (tp, pp, cp) with tp·pp·cp | 8: C(6, 3) = 20 triples, C(5, 3) = 10 of them with pp > 1,
    # which are also interleaved; llama2-7b's 32 layers split evenly over every pp·vpp <= 16 and its
    # head is light: no uneven split
    assert len(found) == (20 + 10) * len(RECOMPUTE)
    assert {(x.tp * x.pp * x.cp * x.dp) for x in found} == {8}
    assert not skipped


def test_tp_must_divide_heads_and_kv_heads():
    qwen = build_config(model="qwen2.5-7b", train=TrainConfig(max_context=4096))  # 28 heads, 4 KV heads
    skipped = Counter()
    found = list(layouts(qwen, 8, [4096] * 4, skipped))
    assert {x.tp for x in found} == {1, 2, 4}
    assert skipped["tp does not divide the heads, KV heads or MLP width"] == 1
    # 28 layers do not split over pp·vpp = 8 or 16: those layouts come with a balanced uneven split
    assert all(sum(x.stage_layers) == 28 for x in found if x.pp * x.vpp in (8, 16))
    assert any(x.stage_layers for x in found if x.pp * x.vpp == 8)


@pytest.mark.parametrize("strategy", ["fixed", "kk", "slimpipe", "slimpack"])
def test_floors_are_below_what_the_simulator_reports(strategy):
    batches = stream_batches(WIKIPEDIA, BASE, 1)
    lengths = [[s.length for s in b] for b in batches]
    for parallel in (ParallelConfig(tp=2, pp=2, dp=1), ParallelConfig(pp=4, dp=2, cp=2), ParallelConfig(tp=4, cp=2)):
        config = build_config(model="llama2-7b", parallel=parallel, train=BASE.train)
        cost = CostModel(config)
        result = simulate(make_planner(strategy, config).plan(batches[0], step=0))
        assert time_floor_s(cost, lengths, strategy) <= result.step_time_s
        assert memory_floor_bytes(cost, max(lengths[0]), strategy) <= max(result.peak_memory_bytes)


def test_tune_finds_the_same_best_as_exhaustive_simulation():
    strategies = ["fixed", "kk", "wlb", "slimpack"]
    pruned = tune(BASE, WIKIPEDIA, 4, strategies)
    every = tune(BASE, WIKIPEDIA, 4, strategies, exhaustive=True)
    tokens = sum(s.length for s in stream_batches(WIKIPEDIA, BASE, 1)[0])
    for fast, full in zip(pruned.strategies, every.strategies, strict=True):
        assert fast.best.layout == full.best.layout
        assert fast.best.tokens_per_s == full.best.tokens_per_s
        assert fast.counts()["pruned: its time floor cannot beat the best simulated layout"] > 0
        for trial in full.trials:
            if trial.ok:  # the floor never exceeds the simulated run's time
                assert trial.floor_s <= tokens / trial.tokens_per_s * (1 + 1e-9)
    assert pruned.best_config().parallel.num_devices == 4


def test_no_layout_fits_is_one_user_error():
    big = build_config(model="llama2-70b", train=TrainConfig(max_context=4096))
    with pytest.raises(UserError, match="no layout of 1 GPUs can hold llama2-70b"):
        tune(big, WIKIPEDIA, 1, ["fixed"])


def test_worker_processes_find_what_one_process_finds():
    def summary(result):
        return [[(t.layout, t.status, t.tokens_per_s) for t in s.trials] for s in result.strategies]

    one = tune(BASE, WIKIPEDIA, 2, ["fixed", "bfd"])
    two = tune(BASE, WIKIPEDIA, 2, ["fixed", "bfd"], workers=2)
    assert summary(two) == summary(one)
    assert [s.strategy for s in two.strategies] == ["fixed", "bfd"]
