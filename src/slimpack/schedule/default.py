"""The schedule a pipeline gets when its plan leaves ``order`` empty, and the dependency graph of a
pipeline's schedule (what the checker verifies and the simulator times)."""

from __future__ import annotations

from slimpack.config import Config
from slimpack.plan.types import PipelinePlan
from slimpack.schedule.builders import (
    Order,
    backward_needs,
    dependency_aware,
    interleaved_1f1b,
    one_f_one_b,
)
from slimpack.schedule.dag import ActionGraph, ScheduleError, build_graph, topological_order


def activation_cap_tokens(config: Config, cost: object, *, cp: int, largest_group_tokens: float
                          ) -> tuple[float, ...]:
    """Per stage: how many tokens' kept activations the stage may hold at once, so that what the
    simulator charges it (model states + kept activations + the running group's working set) stays
    within usable memory. Counts what the simulator counts, through the cost model's own functions:
    each stage's model states, its kept bytes per token (the last stage's include the LM head's
    float32 logits and head inputs), and the working set of the pipeline's largest group (a group
    of whole short samples can hold more tokens than the context). Negative when even one group's
    working set does not fit."""
    from slimpack.cost import CostModel

    assert isinstance(cost, CostModel)
    working = cost.working_bytes(largest_group_tokens, cp=cp)
    usable = config.cluster.usable_memory_bytes
    return tuple((usable - cost.model_state_bytes(stage) - working)
                 / cost.activation_bytes(1.0, virtual_stage=stage, cp=cp)
                 for stage in range(config.parallel.pp))


def default_order(pipeline: PipelinePlan, config: Config, cost: object | None = None, *,
                  where: str = "pipeline") -> Order:
    """1F1B (interleaved when the layout has virtual stages) for symmetric groups, exactly as
    Megatron runs it (no memory throttling: a plan that does not fit is reported as OOM); the
    dependency-aware 1F1B otherwise, with a memory cap when a ``CostModel`` is given."""
    if pipeline.order is not None:
        return pipeline.order
    pp, chunks = config.parallel.pp, config.parallel.virtual_stages
    num = len(pipeline.forward)
    if chunks > 1:
        if not pipeline.symmetric:
            raise ScheduleError(f"{where}: interleaved schedules (virtual_stages > 1) need identical forward "
                                f"and backward groups")
        if num % pp:
            raise ScheduleError(f"{where}: interleaved 1F1B needs a multiple of pp={pp} groups per pipeline, "
                                f"got {num}")
        return interleaved_1f1b(num, pp, chunks)
    if pipeline.symmetric:
        return one_f_one_b(num, pp)
    need = backward_needs(pipeline.forward, pipeline.backward)
    if cost is None:
        return dependency_aware(need, num_forward=num, pp=pp)
    forward_tokens = [sum(s.tokens for s in g) for g in pipeline.forward]
    backward_tokens = [sum(s.tokens for s in g) for g in pipeline.backward]
    caps = activation_cap_tokens(config, cost, cp=pipeline.cp,
                                 largest_group_tokens=max(forward_tokens + backward_tokens, default=0))
    return dependency_aware(need, num_forward=num, pp=pp, forward_tokens=forward_tokens,
                            backward_tokens=backward_tokens, cap_tokens=caps)


def pipeline_graph(pipeline: PipelinePlan, config: Config, cost: object | None = None, *,
                   where: str = "pipeline") -> tuple[ActionGraph, list[int]]:
    """The dependency graph of the pipeline's order (its own, or the default) and a topological order
    of its nodes. Raises ``ScheduleError`` for an order that misses or repeats actions or deadlocks."""
    order = default_order(pipeline, config, cost, where=where)
    graph = build_graph(pipeline, order, pp=config.parallel.pp, chunks=config.parallel.virtual_stages,
                        where=where)
    return graph, topological_order(graph, where)
