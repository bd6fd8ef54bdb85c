"""The planning-ahead loader: same plans as planning inline, and resumable from its state."""

from __future__ import annotations

import json

import pytest

from helpers import config
from slimpack.data import load_dataset
from slimpack.plan import plan_to_dict
from slimpack.runtime.loader import PlanningLoader
from slimpack.strategies.wlb import WLBPlanner


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


def test_resume_at_step_1000_of_wlb_restores_its_queues_without_replay(monkeypatch):
    data = load_dataset("wlbllm")
    walked = PlanningLoader(data, _config(), "wlb", ahead=False)
    for _ in range(1000):
        next(walked)
    state = walked.state_dict()
    assert state["step"] == 1000 and state["held"]  # wlb holds samples back at this point
    expected = _take(walked, 3)
    planned_steps = []
    plan = WLBPlanner.plan
    monkeypatch.setattr(WLBPlanner, "plan", lambda self, batch, *, step: planned_steps.append(step)
                        or plan(self, batch, step=step))
    resumed = PlanningLoader(data, _config(), "wlb", ahead=False)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # a checkpoint is plain JSON
    assert _take(resumed, 3) == expected
    assert planned_steps == [1000, 1001, 1002]  # restored, not replayed
    resumed.close()
