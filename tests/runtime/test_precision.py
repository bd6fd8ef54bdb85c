"""Mixed precision: gradients of the bf16 compute copy accumulate in float32 on the master weights;
``sync`` copies the master weights back into the compute copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slimpack.runtime.precision import MixedPrecision


def test_gradients_accumulate_in_float32_on_the_masters() -> None:
    master = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        master.weight.fill_(1.0)
    mixed = MixedPrecision(master)
    compute = mixed.compute
    assert compute.weight.dtype == torch.bfloat16 and master.weight.dtype == torch.float32
    # 1 + 2^-10 is not a bf16 number: accumulated in bf16, 1 + 2^-10 would round back to 1
    for scale in (1.0, 2.0**-10):
        compute(torch.full((1, 4), scale, dtype=torch.bfloat16)).sum().backward()
    assert compute.weight.grad is None
    assert master.weight.grad.dtype == torch.float32
    assert torch.equal(master.weight.grad, torch.full((1, 4), 1 + 2.0**-10))


def test_sync_copies_master_weights_and_ties_stay_tied() -> None:
    master = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    master[1].weight = master[0].weight  # tied, as a tied LM head
    mixed = MixedPrecision(master)
    assert mixed.compute[1].weight is mixed.compute[0].weight and len(mixed.pairs) == 1
    with torch.no_grad():
        master[0].weight.add_(0.5)
    mixed.sync()
    assert torch.equal(mixed.compute[0].weight, master[0].weight.to(torch.bfloat16))
    assert mixed.masters([mixed.compute[0].weight]) == [master[0].weight]


def test_masters_must_be_float32() -> None:
    with pytest.raises(ValueError, match="float32 master weights"):
        MixedPrecision(nn.Linear(2, 2).double())
