"""Uneven pipeline stages in the runtime: the model is cut by the config's per-chunk layer counts and
a plan on them reproduces the unsliced reference's loss and gradients exactly (float64)."""

import dataclasses

import pytest
import torch

from slimpack.config import ParallelConfig, TrainConfig, build_config, model_preset
from slimpack.plan.types import Sample
from slimpack.runtime import build_model
from slimpack.runtime.verify import verify_plan
from slimpack.strategies import make_planner


def test_split_cuts_the_given_layer_ranges():
    net = build_model(build_config(model="tiny").model)
    stages = net.split(3, (2, 1, 1))
    assert [(s.first_layer, s.end_layer) for s in stages] == [(0, 2), (2, 3), (3, 4)]
    assert stages[0].has_embedding and stages[-1].has_head and not stages[1].has_head
    with pytest.raises(ValueError, match="not a split of 4 layers"):
        net.split(3, (2, 2, 1))


# 384 tokens: four 96-token sequences for the fixed-length baseline, a multiple of pp = 2 as
# interleaved 1F1B needs
BATCH = [Sample(id=i, length=n) for i, n in enumerate((96, 60, 36, 80, 16, 96))]


@pytest.mark.parametrize(("strategy", "pp", "dp", "vpp", "stage_layers"), [
    ("slimpack", 3, 2, 1, (2, 1, 1)),
    ("slimpipe", 3, 2, 1, (1, 2, 1)),
    ("fixed", 2, 1, 2, (1, 2, 1, 1)),  # interleaved: stage 0 runs chunks 0 and 2
])
def test_uneven_plans_match_the_reference_in_float64(strategy, pp, dp, vpp, stage_layers):
    model = dataclasses.replace(model_preset("tiny"), num_layers=sum(stage_layers))
    config = build_config(model=model, parallel=ParallelConfig(pp=pp, dp=dp, virtual_stages=vpp,
                                                                stage_layers=stage_layers),
                          train=TrainConfig(max_context=96, global_batch_tokens=384, recompute="none"))
    plan = make_planner(strategy, config).plan(BATCH, step=0)
    result = verify_plan(plan, model="tiny", dtype=torch.float64)
    assert result.model.num_layers == sum(stage_layers)
    assert result.loss_error < 1e-12
    assert result.max_grad_error < 1e-10


def test_an_interleaved_sliced_asymmetric_plan_runs_exactly_in_its_list_scheduled_order():
    """pp 2 x vpp 2 with slices and reversed backward groups: the runtime follows the plan's
    list-scheduled order (``schedule.list_scheduling``) and matches the unsliced reference."""
    from slimpack.plan.types import PipelinePlan, Plan, Slice

    config = build_config(model="tiny", parallel=ParallelConfig(pp=2, virtual_stages=2),
                          train=TrainConfig(max_context=96, global_batch_tokens=384, recompute="none"))
    forward = ((Slice(0, 0, 40), Slice(1, 0, 30)), (Slice(0, 40, 96), Slice(2, 0, 20)), (Slice(1, 30, 60),))
    backward = ((Slice(1, 30, 60), Slice(0, 40, 96)), (Slice(2, 0, 20), Slice(1, 0, 30)), (Slice(0, 0, 40),))
    plan = Plan(config=config, strategy="test", samples=(Sample(id=0, length=96), Sample(id=1, length=60),
                                                          Sample(id=2, length=20)),
                pipelines=(PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward),))
    assert any(a.chunk == 1 for a in plan.pipelines[0].order[0])  # the default order, resolved at creation
    result = verify_plan(plan, model="tiny", dtype=torch.float64)
    assert result.ordered_pipelines == 1 and result.asymmetric_pipelines == 1
    assert result.loss_error < 1e-12
    assert result.max_grad_error < 1e-10
