"""Context parallelism: zigzag shares of slices, and (2 gloo ranks, float64) the stage executor on
its share with K/V all-gathered over the cp group equals the single-process unsliced reference."""

from __future__ import annotations

import pytest
from dist_workers import context_parallel_stages

from slimpack.plan.cells import GroupLayout, zigzag
from slimpack.plan.types import PipelinePlan, Slice
from slimpack.runtime.launch import spawn


def test_zigzag_gives_each_rank_an_early_and_a_late_chunk():
    assert zigzag(0, 100, (0, 2)) == [(0, 25), (75, 100)]
    assert zigzag(0, 100, (1, 2)) == [(25, 50), (50, 75)]
    assert zigzag(40, 47, (0, 1)) == [(40, 47)]
    # 8 chunks of a 3-token slice (bounds 0 0 0 1 1 1 2 2 3): rank 1 holds nothing
    assert [zigzag(0, 3, (r, 4)) for r in range(4)] == [[(2, 3)], [], [(0, 1), (1, 2)], []]
    for cp in (2, 3, 4):
        for start, end in ((0, 1), (5, 17), (0, 1000)):
            owned = sorted(p for r in range(cp) for p in zigzag(start, end, (r, cp)))
            covered = [t for a, b in owned for t in range(a, b)]
            assert covered == list(range(start, end))  # a partition of the slice


def test_sharded_layout_rows_and_gather_order():
    s = [Slice(0, 0, 8), Slice(0, 8, 12), Slice(1, 0, 4)]
    forward, backward = ((s[0], s[2]), (s[1],)), ((s[1], s[2]), (s[0],))
    layouts = [GroupLayout(forward, backward, {0: 12, 1: 4}, shard=(r, 2)) for r in range(2)]
    # slice (0, 0, 8) -> chunks of 2: rank 0 holds [0, 2) and [6, 8), rank 1 [2, 6)
    assert [lay.group_tokens("F", 0) for lay in layouts] == [4 + 2, 4 + 2]
    cell = layouts[0].cell((0, 1))
    assert [(p.start, p.end) for p in cell.pieces] == [(0, 2), (6, 8)]
    order, width = layouts[0].gather_order(cell)
    assert width == 4 and order == [0, 1, 4, 5, 6, 7, 2, 3]


@pytest.mark.distributed
def test_cp2_matches_the_unsliced_reference():
    """Sample 0 in three slices (K/V prefixes across cells), asymmetric groups, a 1-token sample."""
    s = [Slice(0, 0, 40), Slice(0, 40, 70), Slice(0, 70, 101), Slice(1, 0, 30), Slice(2, 0, 50), Slice(3, 0, 1)]
    forward = ((s[0], s[5]), (s[1], s[3]), (s[2], s[4]))
    backward = ((s[4],), (s[2], s[1]), (s[3], s[0], s[5]))
    pipe = PipelinePlan(replicas=(0,), cp=2, forward=forward, backward=backward)
    lengths = {0: 101, 1: 30, 2: 50, 3: 1}
    results = spawn(context_parallel_stages, 2, (pipe, lengths), timeout_s=120)
    assert sum(r["rows"] for r in results) == sum(lengths.values())
    for r in results:
        assert abs(r["loss"] - r["ref_loss"]) <= 1e-12 * r["ref_loss"]
        assert max(r["errors"].values()) < 1e-10, r["errors"]
