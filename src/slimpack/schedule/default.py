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


def activation_cap_bytes(config: Config, cost: object | None) -> float | None:
    """Bytes of activations a stage may hold: usable memory minus the largest stage's model states
    and one layer's working set at full context. ``None`` without a cost model."""
    if cost is None:
        return None
    from slimpack.cost import CostModel

    assert isinstance(cost, CostModel)
    states = max(cost.model_state_bytes(s) for s in range(config.parallel.pp))
    working = cost.working_bytes(config.train.max_context)
    return config.cluster.usable_memory_bytes - states - working


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
    forward_bytes = backward_bytes = None
    cap = activation_cap_bytes(config, cost)
    if cap is not None:
        from slimpack.cost import CostModel

        assert isinstance(cost, CostModel)
        per_token = cost.activation_bytes(1.0, virtual_stage=0, cp=pipeline.cp)
        forward_bytes = [per_token * sum(s.tokens for s in g) for g in pipeline.forward]
        backward_bytes = [per_token * sum(s.tokens for s in g) for g in pipeline.backward]
    return dependency_aware(need, num_forward=num, pp=pp, forward_bytes=forward_bytes,
                            backward_freed_bytes=backward_bytes, cap_bytes=cap)


def pipeline_graph(pipeline: PipelinePlan, config: Config, cost: object | None = None, *,
                   where: str = "pipeline") -> tuple[ActionGraph, list[int]]:
    """The dependency graph of the pipeline's order (its own, or the default) and a topological order
    of its nodes. Raises ``ScheduleError`` for an order that misses or repeats actions or deadlocks."""
    order = default_order(pipeline, config, cost, where=where)
    graph = build_graph(pipeline, order, pp=config.parallel.pp, chunks=config.parallel.virtual_stages,
                        where=where)
    return graph, topological_order(graph, where)
