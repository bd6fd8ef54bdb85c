"""The schedule a pipeline gets when its planner (or plan file) leaves ``order`` empty.

``plan.types.Plan`` calls ``default_order`` once, when the plan is made or read; everything that
reads a plan afterwards finds the order in it.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain

import numpy as np

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.errors import ScheduleError
from slimpack.schedule.actions import Order, SliceKey, slice_columns
from slimpack.schedule.builders import (
    backward_needs,
    dependency_aware,
    interleaved_1f1b,
    one_f_one_b,
)
from slimpack.schedule.list_scheduling import list_schedule


def activation_cap_tokens(config: Config, cost: CostModel, *, cp: int, largest_group_tokens: float
                          ) -> tuple[float, ...]:
    """Per stage: how many tokens' kept activations the stage may hold at once, so that what the
    simulator charges it (model states + kept activations + the running group's working set) stays
    within usable memory. Counts what the simulator counts, through the cost model's own functions:
    each stage's model states, its kept bytes per token (the last stage's include the LM head's
    float32 logits and head inputs), and the working set of the pipeline's largest group (a group
    of whole short samples can hold more tokens than the context). Negative when even one group's
    working set does not fit.
    A token is counted on every model chunk of the stage (``CostModel.stage_activation_bytes``):
    under interleaving a group's forward runs on each of them before its backward frees the first,
    so at that moment the stage keeps its tokens once per chunk, as it keeps a whole sample."""
    working = cost.working_bytes(largest_group_tokens, cp=cp)
    usable = config.cluster.usable_memory_bytes
    return tuple((usable - cost.model_state_bytes(stage) - working)
                 / cost.stage_activation_bytes(1.0, stage=stage, cp=cp) for stage in range(config.parallel.pp))


def default_order(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], *, cp: int,
                  config: Config, cost: CostModel, where: str = "pipeline") -> Order:
    """1F1B (interleaved when the layout has virtual stages) for symmetric groups, exactly as
    Megatron runs it (no memory throttling: a plan that does not fit is reported as OOM); the
    dependency-aware 1F1B otherwise, holding at most the memory cap of activations in flight, or
    under interleaving the list-scheduled order (``interleaved_order``)."""
    pp, chunks = config.parallel.pp, config.parallel.virtual_stages
    num = len(forward)
    symmetric = tuple(map(tuple, forward)) == tuple(map(tuple, backward))
    if chunks > 1:
        if not symmetric:
            return interleaved_order(forward, backward, cp=cp, config=config, cost=cost)
        if num % pp:  # Megatron's constraint, kept for the baselines that run its schedule
            raise ScheduleError(f"{where}: interleaved 1F1B needs a multiple of pp={pp} groups per pipeline, "
                                f"got {num}")
        return interleaved_1f1b(num, pp, chunks)
    if symmetric:
        return one_f_one_b(num, pp)
    need = backward_needs(forward, backward)
    forward_tokens = [sum(end - start for _, start, end in g) for g in forward]
    backward_tokens = [sum(end - start for _, start, end in g) for g in backward]
    caps = activation_cap_tokens(config, cost, cp=cp,
                                 largest_group_tokens=max(forward_tokens + backward_tokens, default=0))
    return dependency_aware(need, num_forward=num, pp=pp, forward_tokens=forward_tokens,
                            backward_tokens=backward_tokens, cap_tokens=caps)


def interleaved_order(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], *, cp: int,
                      config: Config, cost: CostModel) -> Order:
    """The list-scheduled order (``schedule.list_scheduling``) of a pipeline over its virtual stages,
    with the cost model's time of each group on each model chunk and each device's memory cap:
    usable memory less its model states and the working set of the pipeline's largest group."""
    pp, chunks = config.parallel.pp, config.parallel.virtual_stages
    groups = {"F": forward, "B": backward}
    tokens = {kind: [sum(end - start for _, start, end in g) for g in grps] for kind, grps in groups.items()}
    working = cost.working_bytes(max(tokens["F"] + tokens["B"], default=0), cp=cp)
    caps = [config.cluster.usable_memory_bytes - cost.model_state_bytes(device) - working for device in range(pp)]
    per_token = [cost.activation_bytes(1.0, virtual_stage=v, cp=cp) for v in range(pp * chunks)]

    # virtual stages of one shape (layers, embedding, head) take the same time: each group's
    # token total and attention sum once, then every group on each shape in one cost-model call
    # (the same values, bit for bit, as one ``group_time`` call per group and virtual stage)
    shapes = [cost.chunk_shape(v) for v in range(pp * chunks)]
    like = [shapes.index(shape) for shape in shapes]  # the first virtual stage of the same shape
    sums = {kind: _groups_sums(cost, grps, cp) for kind, grps in groups.items()}
    times = {(kind, v): cost.cells_time(*sums[kind], virtual_stage=v, backward=kind == "B", cp=cp).tolist()
             for kind in groups for v in set(like)}

    return list_schedule(forward, backward, pp=pp, chunks=chunks,
                         durations=lambda kind, vstage: times[(kind, like[vstage])],
                         kept_bytes=lambda kind, vstage: [t * per_token[vstage] for t in tokens[kind]], cap_bytes=caps)


def _groups_sums(cost: CostModel, groups: Sequence[Sequence[SliceKey]], cp: int) -> tuple[np.ndarray, np.ndarray]:
    """Each group's token total and attention-term sum (``CostModel.groups_sums``), its slices
    flattened in one pass."""
    _, starts, ends = slice_columns(chain.from_iterable(groups), sum(map(len, groups)))
    firsts = np.fromiter(accumulate(map(len, groups[:-1]), initial=0), dtype=np.intp, count=len(groups))
    return cost.groups_sums(ends - starts, starts, firsts, cp)
