"""The simulator's tensor- and context-parallel communication against the collectives the runtime
issues for one layer (2 gloo ranks, counted at the dispatcher): same collectives, in the same order,
on the same volumes (``CostModel.layer_collectives``)."""

from __future__ import annotations

import pytest
from dist_workers import collectives_of_one_layer

from slimpack.config import ParallelConfig, build_config, model_preset
from slimpack.cost import CostModel
from slimpack.cost.comm import Collective
from slimpack.runtime.launch import spawn

pytestmark = pytest.mark.distributed

TOKENS = 12  # divisible by 2·cp, so every cp rank holds the same number of rows
TINY = model_preset("tiny")


def _elements_per_rank(c: Collective) -> float:
    """What the dispatcher sees of a collective: an all-reduce's tensor, an all-gather's input shard,
    a reduce-scatter's output shard, in elements."""
    elements = c.size_bytes / TINY.dtype_bytes
    return elements if c.kind == "all_reduce" else elements / c.ranks


def _simulated(backward: bool, **parallel) -> list[tuple[str, float]]:
    cost = CostModel(build_config(model="tiny", parallel=ParallelConfig(**parallel)))
    return [(c.kind, _elements_per_rank(c)) for c in cost.layer_collectives(TOKENS, backward=backward)]


def test_runtime_collectives_are_the_simulators():
    results = spawn(collectives_of_one_layer, 2, (TOKENS,), timeout_s=120)
    shard = TOKENS // 2 * TINY.hidden  # one tp rank's rows of the (T, E) layer input
    for r in results:
        for backward, direction in ((False, "forward"), (True, "backward")):
            # the layer's collectives, then the chunk boundary's all-gather of the rows (forward: the
            # output for the next stage or the head; backward: the input gradient), which the cost
            # model does not charge (Megatron sends the sequence shards point-to-point instead)
            assert r["tp"][direction] == [*_simulated(backward, tp=2), ("all_gather", shard)], direction
            assert r["cp"][direction] == _simulated(backward, cp=2), direction
    # hand-computed: sequence-parallel TP all-gathers each norm's output and reduce-scatters each
    # block's output; backward all-gathers the output gradient and the norm output again (the
    # re-gather of the saved shard) and reduce-scatters the input gradient, per block
    assert results[0]["tp"]["forward"][:4] == [("all_gather", shard), ("reduce_scatter", shard)] * 2
    assert results[0]["tp"]["backward"][:6] == [("all_gather", shard), ("all_gather", shard),
                                                ("reduce_scatter", shard)] * 2
    # CP all-gathers K then V (each rank sends its T/2 rows x kv_hidden), reduce-scatters dK, dV
    assert results[0]["cp"]["forward"] == [("all_gather", TOKENS // 2 * TINY.kv_hidden)] * 2
    assert results[0]["cp"]["backward"] == [("reduce_scatter", TOKENS // 2 * TINY.kv_hidden)] * 2
