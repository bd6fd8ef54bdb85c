"""The plan checker (``slimpack validate``), also run by the simulator and the runtime.

Checks, from the plan alone: every token of every non-deferred sample is in exactly one forward
group and exactly one backward group of exactly one pipeline, with the same slice boundaries in
both; slices of a sample are in forward order across forward groups and in reverse order across
backward groups; replicas and cp are consistent with the layout; each stage's order runs every
action once; and the dependency graph has no cycle (no deadlock).
Must not import torch.
"""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

import numpy as np

from slimpack.config import Config
from slimpack.errors import InvalidPlanError
from slimpack.plan.types import PipelinePlan, Plan, Slice
from slimpack.schedule.actions import slice_columns
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


class _Samples(NamedTuple):
    """The plan's samples sorted by id, as columns: a slice's sample is found by binary search."""

    ids: np.ndarray
    lengths: np.ndarray
    deferred: np.ndarray
    """Per sample, whether the plan defers it."""


class _Pass(NamedTuple):
    """One pass's slices of a pipeline as columns, sorted by (sample, start, end, group, position):
    each sample's slices in a run, in the order a sorted list of (start, end, group, position) per
    sample holds them."""

    sample: np.ndarray
    """Each slice's sample, as an index into ``_Samples`` (into the pipeline's own samples once
    ``_check_pipeline`` renumbers them)."""
    start: np.ndarray
    end: np.ndarray
    group: np.ndarray
    position: np.ndarray
    """Each slice's position within its group."""


def _sorted_samples(lengths: dict[int, int], deferred: tuple[int, ...]) -> _Samples:
    ids = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
    sizes = np.fromiter(lengths.values(), dtype=np.int64, count=len(lengths))
    order = np.argsort(ids, kind="stable")
    return _Samples(ids[order], sizes[order], np.isin(ids[order], np.array(deferred, dtype=np.int64)))


def _pass_slices(groups: tuple[tuple[Slice, ...], ...], samples: _Samples, where: str) -> _Pass:
    """A pass's slices as sorted columns. Names the first empty group or slice out of range, in
    group order."""
    sizes = np.fromiter(map(len, groups), dtype=np.intp, count=len(groups))
    count = int(sizes.sum())
    sid, start, end = slice_columns(chain.from_iterable(groups), count)
    group = np.repeat(np.arange(len(groups)), sizes)
    position = np.arange(count) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    found = np.minimum(np.searchsorted(samples.ids, sid), max(len(samples.ids) - 1, 0))
    known = np.zeros(count, dtype=bool) if not len(samples.ids) else samples.ids[found] == sid
    bad = ~known
    bad[known] = samples.deferred[found[known]] | ~((start[known] >= 0) & (start[known] < end[known])
                                                    & (end[known] <= samples.lengths[found[known]]))
    empty = np.flatnonzero(sizes == 0)
    first_bad = int(np.argmax(bad)) if bad.any() else None
    if empty.size and (first_bad is None or empty[0] < group[first_bad]):
        raise PlanError(f"{where}[{empty[0]}]: empty group")
    if first_bad is not None:  # messages only when failing: plans hold 10^4+ slices
        g, k, s, a, b = (int(column[first_bad]) for column in (group, position, sid, start, end))
        at = f"{where}[{g}][{k}] = [{s}, {a}, {b}]"
        if not known[first_bad]:
            raise PlanError(f"{at}: unknown sample id {s}")
        if samples.deferred[found[first_bad]]:
            raise PlanError(f"{at}: sample {s} is deferred but scheduled")
        raise PlanError(f"{at}: range is not within [0, {int(samples.lengths[found[first_bad]])}) of sample {s} "
                        "or is empty")
    rows = np.lexsort((position, group, end, start, found))
    return _Pass(found[rows], start[rows], end[rows], group[rows], position[rows])


# What can be wrong with a sample of a pipeline, in the order it is checked; the first sample (by
# id) with a problem is named, with its first problem.
ALSO_SCHEDULED, FORWARD_COVERAGE, BACKWARD_COVERAGE, FORWARD_ORDER, BACKWARD_ORDER, CUT_DIFFERENTLY, FINE = range(7)


def _coverage(run: _Pass, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per slice: the token its sample's slices before it reach (0 for the first one), whether it
    starts elsewhere (a gap or an overlap), and whether it is its sample's last slice and stops short
    of the sample's end."""
    first = np.ones(len(run.sample), dtype=bool)
    first[1:] = run.sample[1:] != run.sample[:-1]
    last = np.ones(len(run.sample), dtype=bool)
    last[:-1] = first[1:]
    reached = np.where(first, 0, np.concatenate([[0], run.end[:-1]]))
    return reached, run.start != reached, last & (run.end != lengths[run.sample])


def _out_of_order(run: _Pass, *, reverse: bool) -> np.ndarray:
    """Per slice, whether it breaks its sample's order with the slice before it. Forward: the group
    (and the position within a group) rises with the start; backward: the group falls."""
    g0, g1, k0, k1 = run.group[:-1], run.group[1:], run.position[:-1], run.position[1:]
    later = g1 < g0 if reverse else g1 > g0
    out = np.zeros(len(run.sample), dtype=bool)
    out[1:] = (run.sample[1:] == run.sample[:-1]) & ~(later | ((g1 == g0) & (k1 > k0)))
    return out


def _cut_differently(fwd: _Pass, bwd: _Pass, covered: np.ndarray) -> np.ndarray:
    """The samples, among those each pass ``covered`` exactly once, whose slices differ between
    the passes (two exact covers are the same slices when they have the same starts)."""
    n = len(covered)
    in_fwd, in_bwd = covered[fwd.sample], covered[bwd.sample]
    counts_fwd = np.bincount(fwd.sample[in_fwd], minlength=n)
    counts_bwd = np.bincount(bwd.sample[in_bwd], minlength=n)
    alike = counts_fwd == counts_bwd  # then the two runs of those samples line up slice by slice
    f_rows, b_rows = in_fwd & alike[fwd.sample], in_bwd & alike[bwd.sample]
    moved = fwd.sample[f_rows][fwd.start[f_rows] != bwd.start[b_rows]]
    return np.union1d(np.flatnonzero(covered & ~alike), moved)


def _check_pipeline(p: int, fwd: _Pass, bwd: _Pass, samples: _Samples, owner: np.ndarray) -> None:
    """Each sample pipeline ``p`` schedules: in no earlier pipeline (``owner``, then marked as
    ``p``'s), its tokens in exactly one group of each pass, its slices in order, cut the same in both
    passes. Works on the pipeline's own samples (``mine``), renumbered from 0: a plan has one
    pipeline per replica, and each holds a small share of the batch."""
    mine = np.unique(np.concatenate([fwd.sample, bwd.sample]))
    fwd, bwd = (run._replace(sample=np.searchsorted(mine, run.sample)) for run in (fwd, bwd))
    lengths = samples.lengths[mine]
    problem = np.full(len(mine), FINE)

    def flag(which: np.ndarray, kind: int) -> None:
        problem[which] = np.minimum(problem[which], kind)

    flag(np.flatnonzero(owner[mine] >= 0), ALSO_SCHEDULED)
    found = {}  # per pass (backward?): the pass and what ``_coverage`` found there, for the message
    for run, coverage, order, reverse in ((fwd, FORWARD_COVERAGE, FORWARD_ORDER, False),
                                          (bwd, BACKWARD_COVERAGE, BACKWARD_ORDER, True)):
        reached, elsewhere, short = _coverage(run, lengths)
        found[reverse] = run, reached, elsewhere
        flag(run.sample[elsewhere | short], coverage)
        absent = np.ones(len(mine), dtype=bool)  # a sample seen in one pass only is missing from the other
        absent[run.sample] = False
        flag(np.flatnonzero(absent), coverage)
        flag(run.sample[_out_of_order(run, reverse=reverse)], order)
    flag(_cut_differently(fwd, bwd, problem == FINE), CUT_DIFFERENTLY)
    flagged = np.flatnonzero(problem < FINE)
    if flagged.size:
        local = int(flagged[0])
        sample = int(mine[local])
        raise PlanError(_explain(f"pipelines[{p}]", local, int(problem[local]), found,
                                 sid=int(samples.ids[sample]), length=int(lengths[local]), owner=int(owner[sample])))
    owner[mine] = p


def _explain(where: str, sample: int, kind: int, found: dict[bool, tuple[_Pass, np.ndarray, np.ndarray]], *,
             sid: int, length: int, owner: int) -> str:
    """The message naming the problem ``kind`` of ``sample`` (an index into the pipeline's samples;
    its id ``sid``, its ``length``, the pipeline that already ``owner``s it) and where it is.
    ``found``: per pass (backward?), its slices and what ``_coverage`` found there."""
    if kind == ALSO_SCHEDULED:
        return f"{where}: sample {sid} is also scheduled in pipelines[{owner}]"
    if kind == CUT_DIFFERENTLY:
        return f"{where}: sample {sid} is cut into different slices in forward and backward"
    backward = kind in (BACKWARD_COVERAGE, BACKWARD_ORDER)
    at = f"{where}.backward" if backward else f"{where}.forward"
    run, reached, elsewhere = found[backward]
    rows = np.flatnonzero(run.sample == sample)
    if kind in (FORWARD_COVERAGE, BACKWARD_COVERAGE):
        if not rows.size:
            return f"{at}: sample {sid} tokens [0, {length}) are in no group"
        hit = rows[elsewhere[rows]]
        if not hit.size:
            return f"{at}: sample {sid} tokens [{int(run.end[rows[-1]])}, {length}) are in no group"
        r, got = int(hit[0]), int(reached[hit[0]])
        start, end = int(run.start[r]), int(run.end[r])
        if start < got:
            return f"{at}: sample {sid} tokens [{start}, {min(end, got)}) appear twice (again in group {int(run.group[r])})"
        return f"{at}: sample {sid} tokens [{got}, {start}) are in no group"
    r = int(rows[_out_of_order(run, reverse=backward)[rows]][0])
    rule = "in reverse order (later slices first)" if backward else "in order"
    return (f"{at}: slices of sample {sid} at {int(run.start[r - 1])} (group {int(run.group[r - 1])}) and "
            f"{int(run.start[r])} (group {int(run.group[r])}) are not {rule}")


def check_groups(plan: Plan) -> None:
    """Every check but the schedule's: samples, replicas, coverage and slice order. Raises ``PlanError``.
    The slices are checked as columns: a plan holds 10^4+ of them, and the simulator checks every plan."""
    lengths = _check_samples(plan)
    _check_replicas(plan)
    samples = _sorted_samples(lengths, plan.deferred)
    owner = np.full(len(samples.ids), -1)
    for p, pipe in enumerate(plan.pipelines):
        fwd = _pass_slices(pipe.forward, samples, f"pipelines[{p}].forward")
        bwd = _pass_slices(pipe.backward, samples, f"pipelines[{p}].backward")
        _check_pipeline(p, fwd, bwd, samples, owner)
    missing = samples.ids[(owner < 0) & ~samples.deferred].tolist()
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
