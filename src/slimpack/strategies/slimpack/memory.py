"""Peak memory of a pipeline's schedule without simulating its timeline.

A device runs its actions one after another, so what it holds at any moment depends only on the
order of its own actions, not on their timing: the simulator's memory model (model states, each
forward's kept activations from the start of the forward to the end of the backward that frees
them, and the running action's working set) gives, per device, the maximum over its actions of
(kept activations held while the action runs + the action's working set). The planner uses this to
check every pipeline it returns (a test ties it to ``slimpack.sim``).
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.plan.types import Action, PipelinePlan, group_tokens


def stage_peak_bytes(pipeline: PipelinePlan, order: Sequence[Sequence[Action]], config: Config,
                     cost: CostModel) -> list[float]:
    """Per device of ``pipeline``: the peak bytes the simulator charges it for ``order``."""
    pp = config.parallel.pp
    tokens = {"F": list(map(group_tokens, pipeline.forward)), "B": list(map(group_tokens, pipeline.backward))}
    peaks = []
    for device, actions in enumerate(order):
        # the device's actions as arrays: the cost model's byte counts are plain arithmetic, and a
        # cumulative sum adds the same terms in the same order as a running total would
        size = np.array([tokens[a.kind][a.group] for a in actions], dtype=np.float64)
        forward = np.array([a.kind == "F" for a in actions], dtype=bool)
        chunk = np.array([a.chunk for a in actions], dtype=np.int64)
        kept = np.zeros(len(actions))
        for c in np.unique(chunk).tolist():
            mine = chunk == c
            kept[mine] = cost.activation_bytes(size[mine], virtual_stage=c * pp + device, cp=pipeline.cp)
        steps = np.zeros(2 * len(actions))
        steps[0::2] = np.where(forward, kept, 0.0)  # kept from the forward's start
        steps[1::2] = np.where(forward, 0.0, -kept)  # freed at the backward's end
        held = np.cumsum(steps)[0::2]  # held while each action runs
        peak = max(0.0, float((held + cost.working_bytes(size, cp=pipeline.cp)).max(initial=0.0)))
        peaks.append(cost.model_state_bytes(device) + peak)
    return peaks


def fits(pipeline: PipelinePlan, order: Sequence[Sequence[Action]], config: Config, cost: CostModel) -> bool:
    """Whether every device of the pipeline stays within usable memory under ``order``."""
    usable = config.cluster.usable_memory_bytes
    return all(peak <= usable for peak in stage_peak_bytes(pipeline, order, config, cost))
