"""One rule for attention segments: consecutive slices of one sample form one run."""

import pytest

from slimpack.plan.cells import cell_runs
from slimpack.plan.types import Run, Slice, runs


def test_consecutive_slices_of_one_sample_merge():
    group = [Slice(1, 0, 100), Slice(1, 100, 250), Slice(2, 0, 30), Slice(1, 250, 300)]
    assert runs(group) == [Run(1, 0, 250), Run(2, 0, 30), Run(1, 250, 300)]
    assert [r.tokens for r in runs(group)] == [250, 30, 50]


def test_a_gap_or_a_reversed_order_starts_a_new_run():
    assert runs([Slice(1, 0, 10), Slice(1, 20, 30)]) == [Run(1, 0, 10), Run(1, 20, 30)]
    assert runs([Slice(1, 10, 20), Slice(1, 0, 10)]) == [Run(1, 10, 20), Run(1, 0, 10)]


def test_a_cell_runs_each_sample_as_one_run_whatever_the_listing_order():
    cell = [Slice(3, 64, 128), Slice(5, 0, 7), Slice(3, 0, 64)]
    assert cell_runs(0, 1, cell) == (Run(3, 0, 128), Run(5, 0, 7))


def test_a_cell_with_a_hole_in_a_sample_cannot_run():
    with pytest.raises(ValueError, match=r"slices \(3, 0, 64\) and \(3, 96, 128\) share forward group 0"):
        cell_runs(0, 1, [Slice(3, 0, 64), Slice(3, 96, 128)])
