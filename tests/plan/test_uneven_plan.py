"""A plan on uneven pipeline stages: every strategy plans it, it round-trips through the plan file,
passes the schema and the checker, and simulates."""

import json
from pathlib import Path

import jsonschema
import pytest

from helpers import synthetic_batch
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.plan import plan_from_dict, plan_to_dict
from slimpack.plan.check import check_groups
from slimpack.sim import simulate
from slimpack.strategies import STRATEGIES, make_planner

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "plan.schema.json").read_text())
CONFIG = build_config(model="llama3-8b", parallel=ParallelConfig(tp=8, pp=4, dp=2, stage_layers=(8, 8, 9, 7)),
                      train=TrainConfig(max_context=16384, global_batch_tokens=2**17, recompute="none"))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_plans_uneven_stages_and_the_plan_round_trips(strategy):
    plan = make_planner(strategy, CONFIG).plan(synthetic_batch(3, 2**17, 16384), step=0)
    data = json.loads(json.dumps(plan_to_dict(plan)))
    assert data["config"]["parallel"]["stage_layers"] == [8, 8, 9, 7]
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    again = plan_from_dict(data)
    assert again == plan
    check_groups(again)
    result = simulate(again)
    assert result.step_time_s > result.ideal_time_s > 0
