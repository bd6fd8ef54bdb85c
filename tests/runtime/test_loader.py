"""The planning-ahead loader: same plans as planning inline, and resumable from its state."""

from __future__ import annotations

import pytest

from helpers import config
from slimpack.data import load_dataset
from slimpack.plan import plan_to_dict
from slimpack.runtime.loader import PlanningLoader


def _config():
    return config(pp=2, dp=2, model="tiny", max_context=4096, global_batch_tokens=16384)


def _take(loader: PlanningLoader, n: int) -> list:
    items = [next(loader) for _ in range(n)]
    return [(i.step, _without_timing(plan_to_dict(i.plan)), {k: (v.doc_index, v.chunk) for k, v in i.sources.items()}) for i in items]


def _without_timing(plan: dict) -> dict:
    """The plan without ``info`` (planner wall time differs from run to run)."""
    return {k: v for k, v in plan.items() if k != "info"}


@pytest.mark.parametrize("strategy", ["slimpack", "wlb"])
def test_ahead_equals_inline_and_resume_gives_the_same_steps(strategy):
    data = load_dataset("wikipedia")
    inline = PlanningLoader(data, _config(), strategy, ahead=False)
    expected = _take(inline, 5)
    ahead = PlanningLoader(data, _config(), strategy, ahead=True)
    assert _take(ahead, 2) == expected[:2]
    state = ahead.state_dict()
    assert state["step"] == 2
    ahead.close()
    resumed = PlanningLoader(data, _config(), strategy, ahead=True)
    resumed.load_state_dict(state)
    assert _take(resumed, 3) == expected[2:]
    resumed.close()


def test_loader_turns_the_milp_off():
    loader = PlanningLoader(load_dataset("wikipedia"), _config(), "slimpack")
    assert loader.config.planner.use_milp is False
    loader.close()
