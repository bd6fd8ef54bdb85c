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

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.plan.types import Action, PipelinePlan


def stage_peak_bytes(pipeline: PipelinePlan, order: Sequence[Sequence[Action]], config: Config,
                     cost: CostModel) -> list[float]:
    """Per device of ``pipeline``: the peak bytes the simulator charges it for ``order``."""
    pp = config.parallel.pp
    forward_tokens = [sum(s.tokens for s in g) for g in pipeline.forward]
    backward_tokens = [sum(s.tokens for s in g) for g in pipeline.backward]
    peaks = []
    for device, actions in enumerate(order):
        held = peak = 0.0
        for action in actions:
            vstage = action.chunk * pp + device
            tokens = (forward_tokens if action.kind == "F" else backward_tokens)[action.group]
            kept = cost.activation_bytes(tokens, virtual_stage=vstage, cp=pipeline.cp)
            if action.kind == "F":
                held += kept  # kept from the forward's start
            peak = max(peak, held + cost.working_bytes(tokens, cp=pipeline.cp))
            if action.kind == "B":
                held -= kept  # freed at the backward's end
        peaks.append(cost.model_state_bytes(device) + peak)
    return peaks


def fits(pipeline: PipelinePlan, order: Sequence[Sequence[Action]], config: Config, cost: CostModel) -> bool:
    """Whether every device of the pipeline stays within usable memory under ``order``."""
    usable = config.cluster.usable_memory_bytes
    return all(peak <= usable for peak in stage_peak_bytes(pipeline, order, config, cost))
