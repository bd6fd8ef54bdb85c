"""The plan checker (``slimpack validate``), also run by the simulator and the runtime.

Checks, from the plan alone: every token of every non-deferred sample is in exactly one forward
group and exactly one backward group of exactly one pipeline, with the same slice boundaries in
both; slices of a sample are in forward order across forward groups and in reverse order across
backward groups; replicas and cp are consistent with the layout; each stage's order runs every
action once; and the dependency graph has no cycle (no deadlock).
Must not import torch.
"""

from __future__ import annotations

from slimpack.config import Config
from slimpack.errors import InvalidPlanError
from slimpack.plan.types import PipelinePlan, Plan, Slice
from slimpack.schedule.dag import ActionGraph, build_graph, topological_order


class PlanError(InvalidPlanError):
    """A plan that is not valid; the message names the offending entry."""


def _check_samples(plan: Plan) -> dict[int, int]:
    lengths: dict[int, int] = {}
    for i, sample in enumerate(plan.samples):
        if sample.id in lengths:
            raise PlanError(f"samples[{i}]: duplicate sample id {sample.id}")
        if sample.length <= 0:
            raise PlanError(f"samples[{i}]: sample {sample.id} has length {sample.length}; lengths must be >= 1")
        lengths[sample.id] = sample.length
    seen: set[int] = set()
    for sid in plan.deferred:
        if sid not in lengths:
            raise PlanError(f"deferred: sample id {sid} is not among the samples")
        if sid in seen:
            raise PlanError(f"deferred: sample id {sid} listed twice")
        seen.add(sid)
    return lengths


def _check_replicas(plan: Plan) -> None:
    par = plan.config.parallel
    owner: dict[int, int] = {}
    for p, pipe in enumerate(plan.pipelines):
        if not pipe.replicas:
            raise PlanError(f"pipelines[{p}]: no replicas")
        for r in pipe.replicas:
            if not 0 <= r < par.dp:
                raise PlanError(f"pipelines[{p}]: replica {r} is out of range 0..{par.dp - 1} (dp={par.dp})")
            if r in owner:
                raise PlanError(f"pipelines[{p}]: replica {r} already runs pipelines[{owner[r]}]")
            owner[r] = p
        if pipe.cp != par.cp * len(pipe.replicas):
            raise PlanError(f"pipelines[{p}]: cp={pipe.cp} but {len(pipe.replicas)} merged replica(s) of "
                            f"layout cp={par.cp} give cp={par.cp * len(pipe.replicas)}")
        if pipe.formations is not None and len(pipe.formations) != len(pipe.forward):
            raise PlanError(f"pipelines[{p}]: {len(pipe.formations)} formations for {len(pipe.forward)} forward groups")
    unused = sorted(set(range(par.dp)) - set(owner))
    if unused:
        raise PlanError(f"replica(s) {unused[:8]} run no pipeline (every one of dp={par.dp} replicas must)")


def _slices_by_sample(groups: tuple[tuple[Slice, ...], ...], lengths: dict[int, int], deferred: set[int],
                      where: str) -> dict[int, list[tuple[int, int, int, int]]]:
    """sample -> [(start, end, group index, position in group)]; range checks on the way."""
    out: dict[int, list[tuple[int, int, int, int]]] = {}
    for g, group in enumerate(groups):
        if not group:
            raise PlanError(f"{where}[{g}]: empty group")
        for k, (sid, start, end) in enumerate(group):
            if sid not in lengths or sid in deferred or not 0 <= start < end <= lengths[sid]:
                at = f"{where}[{g}][{k}] = [{sid}, {start}, {end}]"  # only when failing: plans hold 10^4+ slices
                if sid not in lengths:
                    raise PlanError(f"{at}: unknown sample id {sid}")
                if sid in deferred:
                    raise PlanError(f"{at}: sample {sid} is deferred but scheduled")
                raise PlanError(f"{at}: range is not within [0, {lengths[sid]}) of sample {sid} or is empty")
            out.setdefault(sid, []).append((start, end, g, k))
    return out


def _check_partition(sid: int, slices: list[tuple[int, int, int, int]], length: int, where: str) -> None:
    slices = sorted(slices)
    position = 0
    for start, end, g, _ in slices:
        if start < position:
            raise PlanError(f"{where}: sample {sid} tokens [{start}, {min(end, position)}) appear twice (again in group {g})")
        if start > position:
            raise PlanError(f"{where}: sample {sid} tokens [{position}, {start}) are in no group")
        position = end
    if position != length:
        raise PlanError(f"{where}: sample {sid} tokens [{position}, {length}) are in no group")


def _check_order(sid: int, slices: list[tuple[int, int, int, int]], *, reverse: bool, where: str) -> None:
    """Forward: group (and position within a group) increase with start. Backward: groups decrease."""
    slices = sorted(slices)
    for (s0, _, g0, k0), (s1, _, g1, k1) in zip(slices, slices[1:], strict=False):
        ok = (g1 > g0 or (g1 == g0 and k1 > k0)) if not reverse else (g1 < g0 or (g1 == g0 and k1 > k0))
        if not ok:
            rule = "in reverse order (later slices first)" if reverse else "in order"
            raise PlanError(f"{where}: slices of sample {sid} at {s0} (group {g0}) and {s1} (group {g1}) "
                            f"are not {rule}")


def check_groups(plan: Plan) -> None:
    """Every check but the schedule's: samples, replicas, coverage and slice order. Raises ``PlanError``."""
    lengths = _check_samples(plan)
    _check_replicas(plan)
    deferred = set(plan.deferred)
    owner: dict[int, int] = {}
    for p, pipe in enumerate(plan.pipelines):
        where = f"pipelines[{p}]"
        fwd = _slices_by_sample(pipe.forward, lengths, deferred, f"{where}.forward")
        bwd = _slices_by_sample(pipe.backward, lengths, deferred, f"{where}.backward")
        for sid in sorted(fwd.keys() | bwd.keys()):
            if sid in owner:
                raise PlanError(f"{where}: sample {sid} is also scheduled in pipelines[{owner[sid]}]")
            owner[sid] = p
            # a sample seen in one pass only is reported as missing from the other
            _check_partition(sid, fwd.get(sid, []), lengths[sid], f"{where}.forward")
            _check_partition(sid, bwd.get(sid, []), lengths[sid], f"{where}.backward")
            _check_order(sid, fwd[sid], reverse=False, where=f"{where}.forward")
            _check_order(sid, bwd[sid], reverse=True, where=f"{where}.backward")
            if sorted(s[:2] for s in fwd[sid]) != sorted(s[:2] for s in bwd[sid]):
                raise PlanError(f"{where}: sample {sid} is cut into different slices in forward and backward")
    missing = sorted(set(lengths) - deferred - set(owner))
    if missing:
        raise PlanError(f"sample(s) {missing[:8]} are neither scheduled nor deferred ({len(missing)} in all)")


def schedule_graph(pipe: PipelinePlan, config: Config, *, where: str = "pipeline") -> tuple[ActionGraph, list[int]]:
    """The dependency graph of the pipeline's order and a topological order of its nodes. Raises
    ``ScheduleError`` for an order that misses or repeats actions or deadlocks."""
    assert pipe.order is not None, "a Plan resolves every pipeline's order when it is made"
    graph = build_graph(pipe.forward, pipe.backward, pipe.order, pp=config.parallel.pp,
                        chunks=config.parallel.virtual_stages, where=where)
    return graph, topological_order(graph, where)


def check_plan(plan: Plan) -> None:
    """Raise ``PlanError`` (or ``ScheduleError``) naming the first problem; return None for a valid plan."""
    check_groups(plan)
    for p, pipe in enumerate(plan.pipelines):
        schedule_graph(pipe, plan.config, where=f"pipelines[{p}]")
