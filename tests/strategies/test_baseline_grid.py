"""Every baseline on every bundled dataset at 32K, 64K and 128K context: two consecutive steps each
validate and simulate (llama2-7b, tp 8, pp 4, dp 2; batches of 8 contexts to keep cells fast)."""

import pytest

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import bundled_datasets, load_dataset
from slimpack.plan.check import check_plan
from slimpack.sim import simulate
from slimpack.strategies.stream import PlanStream

BASELINES = ("fixed", "bfd", "kk", "wlb", "slimpipe", "bytescale")
DATASETS = ("wikipedia", "textbooks", "wlbllm", "cpython", "pydocs")


def test_the_grid_covers_every_bundled_dataset():
    assert set(DATASETS) == set(bundled_datasets())


@pytest.mark.parametrize("context", [32768, 65536, 131072])
@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("name", BASELINES)
def test_plans_validate_and_simulate(name, dataset, context):
    config = build_config(model="llama2-7b", gpu="h100-sxm", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                          train=TrainConfig(max_context=context, global_batch_tokens=8 * context))
    stream = PlanStream(load_dataset(dataset), config, name, shuffle=True)
    for _ in range(2):
        plan = next(stream).plan
        check_plan(plan)
        result = simulate(plan, check=False)
        assert result.step_time_s > 0 and result.num_tokens > 0
