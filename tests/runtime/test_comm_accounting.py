"""The simulator's tensor- and context-parallel communication against the collectives the runtime
issues for one layer (2 gloo ranks, counted at the dispatcher): same collectives, same volumes."""

from __future__ import annotations

import numpy as np
import pytest
from dist_workers import collectives_of_one_layer

from slimpack.config import ParallelConfig, build_config, model_preset
from slimpack.cost import CostModel
from slimpack.cost.model import TP_COLLECTIVES_FORWARD
from slimpack.runtime.launch import spawn

pytestmark = pytest.mark.distributed

TOKENS = 12  # divisible by 2·cp, so every cp rank holds the same number of rows
TINY = model_preset("tiny")


def _cost(**parallel: int) -> tuple[CostModel, float, float]:
    # the runtime's TP has no sequence parallelism: compare with the cost model's non-SP count
    cost = CostModel(build_config(model="tiny", parallel=ParallelConfig(sequence_parallel=False, **parallel)))
    _gemm, _attn, tp_comm, cp_comm = cost._layer_parts(np.array([TOKENS]), np.array([0.0]), cost.cp)
    return cost, tp_comm, cp_comm


def test_runtime_collectives_are_the_simulators():
    results = spawn(collectives_of_one_layer, 2, (TOKENS,), timeout_s=120)
    bandwidth, latency = build_config(model="tiny").cluster.link(same_node=True)
    dtype_bytes = TINY.dtype_bytes

    # TP: the simulator charges TP_COLLECTIVES_FORWARD ring passes (reduce-scatter or all-gather) of
    # the (T, E) activation per pass (the same backward without SP); the runtime all-reduces (= one of
    # each) twice per pass
    _, tp_comm, _ = _cost(tp=2)
    ring_pass_elements = (tp_comm - latency) * bandwidth * 2 / dtype_bytes
    for r in results:
        for direction in ("forward", "backward"):
            records = r["tp"][direction]
            assert [kind for kind, _ in records] == ["all_reduce", "all_reduce"], (direction, records)
            assert 2 * len(records) == TP_COLLECTIVES_FORWARD
            assert all(n == TOKENS * TINY.hidden for _, n in records)
            assert all(n == pytest.approx(ring_pass_elements) for _, n in records)

    # CP: the simulator passes each rank's K and V shard cp-1 times forward and twice that backward
    # (a ring re-sends K/V and sends dK/dV); the runtime all-gathers K and V forward (the same
    # elements) and reduce-scatters dK and dV backward (half the simulator's backward charge)
    cost, _, cp_comm = _cost(cp=2)
    simulated_elements = (cp_comm - latency) * bandwidth / dtype_bytes
    for r in results:
        forward, backward = r["cp"]["forward"], r["cp"]["backward"]
        assert [k for k, _ in forward] == ["all_gather", "all_gather"]
        assert [k for k, _ in backward] == ["reduce_scatter", "reduce_scatter"]
        shard = TOKENS // 2 * TINY.kv_hidden
        assert all(n == shard for _, n in forward + backward)
        sent_per_pass = (2 - 1) * sum(n for _, n in forward)  # ring: cp-1 shards out of each rank
        assert sent_per_pass == pytest.approx(simulated_elements)
        assert (2 - 1) * sum(n for _, n in backward) == pytest.approx(simulated_elements)
