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
    # the runtime's TP has no sequence parallelism: compare with the cost model without it
    cost = CostModel(build_config(model="tiny", parallel=ParallelConfig(sequence_parallel=False, **parallel)))
    return [(c.kind, _elements_per_rank(c)) for c in cost.layer_collectives(TOKENS, backward=backward)]


def test_runtime_collectives_are_the_simulators():
    results = spawn(collectives_of_one_layer, 2, (TOKENS,), timeout_s=120)
    for r in results:
        for backward, direction in ((False, "forward"), (True, "backward")):
            assert r["tp"][direction] == _simulated(backward, tp=2), direction
            assert r["cp"][direction] == _simulated(backward, cp=2), direction
    # hand-computed: TP all-reduces the whole (T, E) activation after attention and after the MLP;
    # CP all-gathers K then V (each rank sends its T/2 rows x kv_hidden), reduce-scatters dK, dV
    assert results[0]["tp"]["forward"] == [("all_reduce", TOKENS * TINY.hidden)] * 2
    assert results[0]["cp"]["forward"] == [("all_gather", TOKENS // 2 * TINY.kv_hidden)] * 2
    assert results[0]["cp"]["backward"] == [("reduce_scatter", TOKENS // 2 * TINY.kv_hidden)] * 2
