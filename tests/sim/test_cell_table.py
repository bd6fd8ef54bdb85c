"""The simulator prices all cells of a pipeline in one array call (``CellTable``): every group's time
must equal, bit for bit, the sum of one ``CostModel.group_time`` call per cell (``group_cells``)."""

import random
from functools import reduce
from operator import add

from hypothesis import given, settings

from helpers import config
from random_plans import plans
from slimpack.cost import CostModel
from slimpack.plan.types import PipelinePlan, Slice
from slimpack.sim.simulate import CellTable, group_cells


def _per_cell_sums(pipe: PipelinePlan, cost: CostModel, vstage: int) -> dict[str, list[float]]:
    """Each group's cells' times added left to right (``reduce``: from Python 3.12 on, ``sum`` of
    floats compensates its rounding)."""
    forward, backward = group_cells(pipe)
    return {kind: [reduce(add, (cost.group_time(tokens, prefix, virtual_stage=vstage, backward=kind == "B",
                                                cp=pipe.cp) for tokens, prefix in cells), 0.0) for cells in groups]
            for kind, groups in (("F", forward), ("B", backward))}


def _assert_exact(pipe: PipelinePlan, cost: CostModel) -> None:
    table = CellTable(pipe, pipe.cp, cost, where="pipe")
    for vstage in range(cost.num_chunks):
        expected = _per_cell_sums(pipe, cost, vstage)
        for kind in "FB":
            assert table.group_times(cost, kind, vstage) == expected[kind], (kind, vstage)
    forward, backward = group_cells(pipe)
    assert table.group_tokens == {kind: [sum(int(t.sum()) for t, _ in cells) for cells in groups]
                                  for kind, groups in (("F", forward), ("B", backward))}
    assert table.counts == (tuple(map(len, forward)), tuple(map(len, backward)))


@settings(max_examples=60, deadline=None)
@given(plans())
def test_cell_table_equals_one_cost_call_per_cell(plan):
    cost = CostModel(plan.config)
    for pipe in plan.pipelines:
        _assert_exact(pipe, cost)


def test_cells_with_many_runs_sum_as_numpy_does():
    # numpy sums arrays of 8 or more elements pairwise: groups of dozens of samples (cells of many
    # runs), sliced across groups, under context parallelism, on every chunk of a pipeline
    rng = random.Random(7)
    for cp in (1, 2):
        cfg = config(pp=4, max_context=131072)
        cost = CostModel(cfg)
        lengths = [rng.randint(1, 9000) for _ in range(150)]
        chains = [[Slice(i, 0, n)] if n < 4000 else [Slice(i, 0, n // 3), Slice(i, n // 3, n)]
                  for i, n in enumerate(lengths)]
        flat = [s for chain in chains for s in chain]
        forward = tuple(tuple(flat[k:k + 40]) for k in range(0, len(flat), 40))
        # backward: the same slices, each sample's later slice first, in groups of another size
        reverse = [s for chain in reversed(chains) for s in reversed(chain)]
        backward = tuple(tuple(sorted(reverse[k:k + 55])) for k in range(0, len(reverse), 55))
        pipe = PipelinePlan(replicas=(0,), cp=cp, forward=forward, backward=backward)
        assert max(len(cells) for cells in group_cells(pipe)[0]) >= 1
        assert max(len(t) for cells in group_cells(pipe)[0] for t, _ in cells) >= 8
        _assert_exact(pipe, cost)
