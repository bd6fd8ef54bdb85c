"""The simulator's tensor- and context-parallel communication against the collectives the runtime
issues for one layer (2 gloo ranks, recorded by ``runtime.collectives.CollectiveLog``): same
collectives, in the same order, on the same volumes (``CostModel.layer_collectives``)."""

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
RUNTIME_BYTES = 8  # the worker runs in float64


def _elements(records: list[Collective], element_bytes: int) -> list[tuple[str, str, int, float]]:
    return [(c.kind, c.group, c.ranks, c.size_bytes / element_bytes) for c in records]


def _simulated(backward: bool, **parallel) -> list[tuple[str, str, int, float]]:
    cost = CostModel(build_config(model="tiny", parallel=ParallelConfig(**parallel)))
    return _elements(list(cost.layer_collectives(TOKENS, backward=backward)), TINY.dtype_bytes)


def test_runtime_collectives_are_the_simulators():
    results = spawn(collectives_of_one_layer, 2, (TOKENS,), timeout_s=120)
    layer_input = TOKENS * TINY.hidden  # elements of the (T, E) layer input
    for r in results:
        for backward, direction in ((False, "forward"), (True, "backward")):
            tp, cp = _elements(r["tp"][direction], RUNTIME_BYTES), _elements(r["cp"][direction], RUNTIME_BYTES)
            # the layer's collectives, then the chunk boundary's all-gather of the rows (forward: the
            # output for the next stage; backward: the input gradient), which the cost model does not
            # charge (Megatron sends each tp rank's sequence shard point-to-point instead)
            assert tp == [*_simulated(backward, tp=2), ("all_gather", "tp", 2, layer_input)], direction
            assert cp == _simulated(backward, cp=2), direction
    # hand-computed: sequence-parallel TP all-gathers each norm's output and reduce-scatters each
    # block's output; backward all-gathers the output gradient and the norm output again (the
    # re-gather of the saved shard) and reduce-scatters the input gradient, per block
    tp = results[0]["tp"]
    assert [c.kind for c in tp["forward"][:4]] == ["all_gather", "reduce_scatter"] * 2
    assert [c.kind for c in tp["backward"][:6]] == ["all_gather", "all_gather", "reduce_scatter"] * 2
    assert all(c.size_bytes == layer_input * RUNTIME_BYTES for c in tp["forward"] + tp["backward"])
    # each tp rank sends half its (T, E) rows per all-gather or reduce-scatter
    assert tp["forward"][0].sent_bytes() == layer_input / 2 * RUNTIME_BYTES
    # CP all-gathers K then V (each rank sends its T/2 rows x kv_hidden), reduce-scatters dK, dV
    cp = results[0]["cp"]
    assert [c.kind for c in cp["forward"]] == ["all_gather"] * 2
    assert [c.kind for c in cp["backward"]] == ["reduce_scatter"] * 2
    assert all(c.sent_bytes() == TOKENS // 2 * TINY.kv_hidden * RUNTIME_BYTES for c in cp["forward"] + cp["backward"])
