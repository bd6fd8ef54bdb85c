"""The simulator charges what the executor runs: one call of GEMMs and attention per cell."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from runtime_plans import pipelines, random_actions

from slimpack.config import model_preset
from slimpack.runtime import StageExecutor, build_model, random_tokens
from slimpack.runtime import executor as executor_module
from slimpack.runtime.model import Block
from slimpack.sim.simulate import group_cells

TINY = model_preset("tiny")


class _Counter:
    def __init__(self) -> None:
        self.attention = self.projections = self.backward_cells = 0


@settings(settings.get_profile("runtime"))
@given(case=pipelines())
def test_kernels_per_group_match_the_simulators_cells(case) -> None:
    pipe, lengths = case
    forward_cells, backward_cells = group_cells(pipe)
    net = build_model(TINY, dtype=torch.float64)
    stage = StageExecutor(net.stage(0, TINY.num_layers), pipe.forward, pipe.backward, sample_lengths=lengths,
                          tokens=random_tokens(lengths, TINY.vocab_size), backend="math")
    counter = _Counter()
    attention, projections, backward_cells_of = (executor_module.varlen_attention, Block.attention_inputs,
                                                 StageExecutor._backward_cells)

    def counting_attention(*args, **kwargs):
        counter.attention += 1
        return attention(*args, **kwargs)

    def counting_projections(self, *args, **kwargs):
        counter.projections += 1
        return projections(self, *args, **kwargs)

    def counting_backward(self, states, *args, **kwargs):
        counter.backward_cells += len(states)
        return backward_cells_of(self, states, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executor_module, "varlen_attention", counting_attention)
        patch.setattr(Block, "attention_inputs", counting_projections)
        patch.setattr(StageExecutor, "_backward_cells", counting_backward)
        for action in random_actions(pipe, random.Random(0)):
            counter.attention = counter.projections = counter.backward_cells = 0
            if action.kind == "F":
                stage.forward(action.group)
                # per layer, one attention call and one QKV projection per cell the simulator charges
                assert counter.attention == counter.projections == TINY.num_layers * len(forward_cells[action.group])
            else:
                stage.backward(action.group)
                assert counter.backward_cells == len(backward_cells[action.group])
    assert stage.finished
