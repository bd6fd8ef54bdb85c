"""``runtime.throughput``: the sliced pipeline it times, and the relations between its figures."""

from __future__ import annotations

import pytest
import torch

from slimpack.config import model_preset
from slimpack.plan.types import Slice
from slimpack.runtime import build_model
from slimpack.runtime.throughput import slice_throughput, sliced_pipeline


def test_sliced_pipeline_cuts_near_equal_slices_one_per_group():
    pipe = sliced_pipeline(10, 3)
    assert pipe.forward == ((Slice(0, 0, 3),), (Slice(0, 3, 6),), (Slice(0, 6, 10),))
    assert pipe.backward == pipe.forward[::-1]
    assert sliced_pipeline(5, 1).forward == ((Slice(0, 0, 5),),)
    with pytest.raises(ValueError, match="cannot cut 4 tokens into 5 slices"):
        sliced_pipeline(4, 5)


def test_slice_throughput_figures_are_consistent():
    model = build_model(model_preset("tiny"), seed=0, dtype=torch.float32)
    rows = slice_throughput(model, 64, [4], backend="cpu", repeats=1)
    assert [r.slices for r in rows] == [1, 4]
    one, four = rows
    assert one.relative == 1.0 and one.per_group_layer_ms == 0.0
    assert four.relative == pytest.approx(one.seconds / four.seconds)
    assert four.tokens_per_s == pytest.approx(64 / four.seconds)
    assert four.per_group_layer_ms == pytest.approx((four.seconds - one.seconds) / 3 / 4 * 1e3)
    assert all(p.grad is None for p in model.parameters())  # timing leaves the model as it was
