"""Phase 2 refinement: a makespan MILP (HiGHS) that moves whole samples between neighbouring groups.

The heuristic cut (``cutting``) balances groups up to the granularity of samples that cannot be
cut (short ones, or ones whose pieces would fall under the minimum slice). This MILP takes the
heuristic's groups as a warm start and re-assigns every whole sample among the groups within
``window`` of its own, minimising the total overload above the mean group cost (every group that
runs long delays the pipeline's steady state, not only the longest one, and a longest group made of
slices alone cannot shrink):

    min Σ_g e_g   s.t.  e_g ≥ fixed_g + Σ_j cost_j · x_jg − mean   (every group g),  e_g ≥ 0
                        Σ_g x_jg = 1                              (every movable sample j),  x binary.

Sliced samples stay where they are (their slices' order is what the schedule depends on). The solve
is single-threaded with a fixed seed and a node limit, so it is deterministic; the wall-clock limit
is a safety net, and on time-out or failure the heuristic's groups are kept.
Must not import torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import highspy
import numpy as np

from slimpack.plan.types import Slice


@cache
def _silence_highs_banner() -> None:
    """HiGHS writes its copyright banner to the process's stdout (C level, before any option can be
    set) the first time a solver is made; make that first one with stdout pointed at /dev/null so
    ``slimpack compare`` output stays the user's table."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@dataclass(frozen=True, slots=True)
class MilpResult:
    groups: list[list[Slice]]
    status: str
    """'improved', 'kept' (no better solution), 'skipped' (nothing movable) or 'failed'."""
    before: float
    """Total overload (seconds above the mean group cost) of the heuristic's groups."""
    after: float


ACTIVE_ABOVE = 0.01
"""Groups more than this share above the mean (and their neighbours) are re-optimised."""
SKIP_BELOW = 0.01
"""The MILP runs only when the heuristic's overload exceeds this share of the groups' total cost:
below it, measured gains were within noise and not worth the solver time."""


def rebalance(groups: Sequence[Sequence[Slice]], group_cost: Callable[[Sequence[Slice]], float],
              slice_cost: Callable[[Slice], float], *, window: int = 1, time_limit_s: float = 1.0,
              node_limit: int = 100) -> MilpResult:
    owner: dict[int, set[int]] = {}
    for g, group in enumerate(groups):
        for s in group:
            owner.setdefault(s.sample_id, set()).add(g)
    loads = [group_cost(g) for g in groups]
    total = sum(loads)
    mean = total / len(groups)
    before = sum(max(0.0, load - mean) for load in loads)
    unchanged = MilpResult([list(g) for g in groups], "skipped", before, before)
    if len(groups) < 2 or before <= SKIP_BELOW * total:
        return unchanged
    # only overloaded groups and their neighbours take part: the MILP stays small, the rest of the
    # pipeline is left as it is
    active = sorted({n for g, load in enumerate(loads) if load > mean * (1 + ACTIVE_ABOVE)
                     for n in range(max(0, g - window), min(len(groups), g + window + 1))})
    column_of = {g: k for k, g in enumerate(active)}
    # a sample wholly inside one active group moves as one unit (all its slices there, in order)
    units: dict[int, list[Slice]] = {}
    for g in active:
        for s in groups[g]:
            if len(owner[s.sample_id]) == 1:
                units.setdefault(s.sample_id, []).append(s)
    if not units:
        return unchanged
    movable = [(next(iter(owner[sid])), tuple(slices)) for sid, slices in units.items()]
    staying = {g: [s for s in groups[g] if s.sample_id not in units] for g in active}
    fixed = {g: group_cost(staying[g]) for g in active}
    costs = [sum(slice_cost(s) for s in unit) for _, unit in movable]
    cols = [(j, g) for j, (home, _) in enumerate(movable)
            for g in range(home - window, home + window + 1) if g in column_of]
    num_x, num_e = len(cols), len(active)
    _silence_highs_banner()
    h = highspy.Highs()
    for option, value in (("output_flag", False), ("threads", 1), ("random_seed", 0),
                          ("time_limit", max(1e-3, time_limit_s)), ("mip_max_nodes", node_limit),
                          ("mip_heuristic_effort", 0.3)):
        h.setOptionValue(option, value)
    inf = highspy.kHighsInf
    # columns: x (binary) for every (unit, group) pair, then one overload e_g per active group
    h.addCols(num_x + num_e, np.concatenate([np.zeros(num_x), np.ones(num_e)]), np.zeros(num_x + num_e),
              np.concatenate([np.ones(num_x), np.full(num_e, inf)]), 0, np.array([], dtype=np.int32),
              np.array([], dtype=np.int32), np.array([]))
    h.changeColsIntegrality(num_x, np.arange(num_x, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * num_x))
    by_group: dict[int, list[int]] = {g: [] for g in active}
    by_item: list[list[int]] = [[] for _ in movable]
    for c, (j, g) in enumerate(cols):
        by_group[g].append(c)
        by_item[j].append(c)
    for g in active:  # Σ cost·x − e_g ≤ mean − fixed_g
        idx = np.array([*by_group[g], num_x + column_of[g]], dtype=np.int32)
        h.addRow(-inf, mean - fixed[g], len(idx), idx, np.array([*(costs[cols[c][0]] for c in by_group[g]), -1.0]))
    for items in by_item:  # every unit in exactly one group
        h.addRow(1.0, 1.0, len(items), np.array(items, dtype=np.int32), np.ones(len(items)))
    start = [1.0 if g == movable[j][0] else 0.0 for j, g in cols]
    start += [max(0.0, loads[g] - mean) for g in active]
    solution = highspy.HighsSolution()
    solution.col_value = start
    solution.value_valid = True
    h.setSolution(solution)
    h.run()
    values = np.asarray(h.getSolution().col_value)
    if h.getModelStatus() not in _USABLE or len(values) != num_x + num_e:
        return MilpResult([list(g) for g in groups], "failed", before, before)
    new_groups = [list(staying.get(g, group)) for g, group in enumerate(groups)]
    for j, (home, unit) in enumerate(movable):
        target = max(by_item[j], key=lambda c: (values[c], -abs(cols[c][1] - home)))
        new_groups[cols[target][1]].extend(unit)
    if not all(new_groups):
        return MilpResult([list(g) for g in groups], "kept", before, before)
    new_loads = {g: group_cost(new_groups[g]) for g in active}
    after = before + sum(max(0.0, new_loads[g] - mean) - max(0.0, loads[g] - mean) for g in active)
    if after >= before * (1 - 1e-9):
        return MilpResult([list(g) for g in groups], "kept", before, before)
    return MilpResult(new_groups, "improved", before, after)


_USABLE = (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit,
           highspy.HighsModelStatus.kSolutionLimit, highspy.HighsModelStatus.kInterrupt)
