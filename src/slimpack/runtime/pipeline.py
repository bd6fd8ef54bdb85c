"""Single-process drivers: run every stage of a pipeline, handing activations and gradients over.

``run_in_order`` runs a list of actions, each through every stage (forward: first to last stage;
backward: last to first) — the natural valid order for one process is all forward groups, then all
backward groups. ``run_stage_orders`` runs per-stage action lists (a plan's ``order``, possibly
interleaved with virtual stages) as a pipeline would, lowered into receive / compute / send steps
by ``schedule.lowering``: a stage's next action runs once its input (activation from the stage
before, or gradient from the stage after) has been sent; if no stage can move, the order deadlocks
and a ``ScheduleError`` shows where each stage is waiting.
The distributed runtime replaces the hand-over with P2P transfers; the executors are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from slimpack.errors import ScheduleError
from slimpack.plan.types import Action, PipelinePlan
from slimpack.runtime.executor import StageExecutor
from slimpack.runtime.memory import ActivationTracker
from slimpack.runtime.model import Transformer
from slimpack.schedule.lowering import Transfer, lower_action, walk


def build_executors(model: Transformer, pipeline: PipelinePlan, *, num_chunks: int,
                    sample_lengths: Mapping[int, int], tokens: Mapping[int, torch.Tensor],
                    num_loss_tokens: int, backend: str = "auto", track_memory: bool = False,
                    stages_per_pipeline: int | None = None,
                    stage_layers: Sequence[int] = ()) -> list[StageExecutor]:
    """One executor per model chunk (virtual stage) of ``pipeline``, chunks in layer order.

    With interleaving, chunk v runs on pipeline stage v % pp as its chunk v // pp
    (``stages_per_pipeline`` = pp names them in messages). ``stage_layers``: layers per chunk, as a
    config's ``parallel.stage_layers`` (empty = even).
    """
    pp = stages_per_pipeline or num_chunks
    params = list(model.parameters())
    lengths = {sid: sample_lengths[sid] for group in pipeline.forward for sid, _, _ in group}
    executors = []
    for v, stage in enumerate(model.split(num_chunks, stage_layers)):
        name = f"stage {v % pp}" + (f" chunk {v // pp}" if num_chunks > pp else "")
        executors.append(StageExecutor(
            stage, pipeline.forward, pipeline.backward, sample_lengths=lengths, tokens=tokens,
            num_loss_tokens=num_loss_tokens, backend=backend, name=name,
            tracker=ActivationTracker(exclude=params) if track_memory else None))
    return executors


def default_actions(pipeline: PipelinePlan) -> list[Action]:
    """All forward groups in order, then all backward groups in order."""
    return ([Action("F", g) for g in range(len(pipeline.forward))]
            + [Action("B", g) for g in range(len(pipeline.backward))])


def run_in_order(executors: Sequence[StageExecutor], actions: Sequence[Action | str],
                 on_action: Callable[[Action], None] | None = None) -> torch.Tensor:
    """Run each action through all stages; returns the summed loss of the forward groups run.
    ``on_action(action)`` is called after each action has run on every stage."""
    loss = torch.zeros((), dtype=executors[0].dtype, device=executors[0].device)
    for item in actions:
        action = Action.parse(item) if isinstance(item, str) else item
        if action.kind == "F":
            x = None
            for executor in executors:
                x = executor.forward(action.group, x)
            assert x is not None
            loss = loss + x.sum() / max(executors[-1].num_loss_tokens, 1)
        else:
            grad = None
            for executor in reversed(executors):
                grad = executor.backward(action.group, grad)
        if on_action is not None:
            on_action(action)
    return loss


def run_stage_orders(executors: Sequence[StageExecutor], order: Sequence[Sequence[Action | str]]) -> torch.Tensor:
    """Run per-stage action lists (``order[stage]``; action chunk c of stage s is executor
    c·pp + s) in the order ``schedule.lowering.walk`` gives, handing each transfer over in memory;
    returns the summed loss. Raises ``ScheduleError`` on a deadlock (before running anything) or
    unfinished work."""
    pp = len(order)
    if len(executors) % pp:
        raise ValueError(f"{len(executors)} model chunks cannot be spread over {pp} stages")
    chunks = len(executors) // pp
    actions = [[Action.parse(a) if isinstance(a, str) else a for a in stage] for stage in order]
    mailbox: dict[Transfer, torch.Tensor] = {}
    loss = torch.zeros((), dtype=executors[0].dtype, device=executors[0].device)
    for device, index in walk(actions, chunks=chunks, where="pipeline").computes:
        received = None
        for step in lower_action(actions[device][index], device, pp=pp, chunks=chunks):
            executor = executors[step.vstage]
            if step.op == "recv":
                received = mailbox.pop(step.transfer)  # type: ignore[arg-type]
            elif step.op == "compute" and step.action.kind == "F":
                out = executor.forward(step.action.group, received)
                if step.vstage == len(executors) - 1:
                    loss = loss + out.sum() / max(executor.num_loss_tokens, 1)
            elif step.op == "compute":
                out = executor.backward(step.action.group, received)
            else:
                mailbox[step.transfer] = out  # type: ignore[index]
    for executor in executors:
        if not executor.finished:
            left = executor.unfinished()
            raise ScheduleError(f"the action order leaves {len(left)} slice(s) without backward on "
                                f"{executor.name}, e.g. {tuple(left[0])}")
    return loss
