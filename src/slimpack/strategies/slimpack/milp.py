"""Phase 2 refinement: a makespan MILP (HiGHS) that moves whole samples between neighbouring groups.

The heuristic cut (``partition``) balances groups up to the granularity of samples that cannot be
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from slimpack.plan.types import Slice


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

    def overload(candidate: Sequence[Sequence[Slice]]) -> float:
        return sum(max(0.0, group_cost(g) - mean) for g in candidate)

    # only overloaded groups and their neighbours take part: the MILP stays small (and is solved to
    # optimality within the node limit in practice), the rest of the pipeline is left as it is
    active = sorted({n for g, load in enumerate(loads) if load > mean * (1 + ACTIVE_ABOVE)
                     for n in range(max(0, g - window), min(len(groups), g + window + 1))})
    in_active = set(active)
    # a sample wholly inside one active group moves as one unit (all its slices there, in order)
    units: dict[int, list[Slice]] = {}
    for g in active:
        for s in groups[g]:
            if len(owner[s.sample_id]) == 1:
                units.setdefault(s.sample_id, []).append(s)
    movable = [(next(iter(owner[sid])), tuple(slices)) for sid, slices in units.items()]
    staying = [[s for s in group if s.sample_id not in units] for group in groups]
    before = overload(groups)
    if not movable or len(groups) < 2 or before <= SKIP_BELOW * total:
        return MilpResult([list(g) for g in groups], "skipped", before, before)
    fixed = [group_cost(group) for group in staying]
    num_groups = len(groups)
    cols: list[tuple[int, int]] = []  # (movable index, group)
    for j, (home, _) in enumerate(movable):
        for g in range(max(0, home - window), min(num_groups, home + window + 1)):
            if g in in_active:
                cols.append((j, g))
    costs = np.array([sum(slice_cost(s) for s in unit) for _, unit in movable])
    h = highspy.Highs()
    for option, value in (("output_flag", False), ("threads", 1), ("random_seed", 0),
                          ("time_limit", time_limit_s), ("mip_max_nodes", node_limit), ("mip_heuristic_effort", 0.3)):
        h.setOptionValue(option, value)
    inf = highspy.kHighsInf
    num_x = len(cols)
    # columns: x (binary), then one overload e_g per group
    objective = np.concatenate([np.zeros(num_x), np.ones(num_groups)])
    upper = np.concatenate([np.ones(num_x), np.full(num_groups, inf)])
    h.addCols(num_x + num_groups, objective, np.zeros(num_x + num_groups), upper, 0,
              np.array([], dtype=np.int32), np.array([], dtype=np.int32), np.array([]))
    h.changeColsIntegrality(num_x, np.arange(num_x, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * num_x))
    by_group: list[list[int]] = [[] for _ in range(num_groups)]
    by_item: list[list[int]] = [[] for _ in movable]
    for c, (j, g) in enumerate(cols):
        by_group[g].append(c)
        by_item[j].append(c)
    for g in range(num_groups):  # Σ cost x - e_g <= mean - fixed_g (inactive groups: no x, e_g = overload)
        idx = np.array([*by_group[g], num_x + g], dtype=np.int32)
        val = np.array([*(costs[cols[c][0]] for c in by_group[g]), -1.0])
        h.addRow(-inf, mean - fixed[g], len(idx), idx, val)
    for j in range(len(movable)):
        idx = np.array(by_item[j], dtype=np.int32)
        h.addRow(1.0, 1.0, len(idx), idx, np.ones(len(idx)))
    start = [1.0 if cols[c][1] == movable[cols[c][0]][0] else 0.0 for c in range(num_x)]
    start += [max(0.0, group_cost(group) - mean) for group in groups]
    solution = highspy.HighsSolution()
    solution.col_value = list(start)
    solution.value_valid = True
    h.setSolution(solution)
    h.run()
    if h.getModelStatus() not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit,
                                  highspy.HighsModelStatus.kSolutionLimit, highspy.HighsModelStatus.kInterrupt):
        return MilpResult([list(g) for g in groups], "failed", before, before)
    values = np.asarray(h.getSolution().col_value)
    if len(values) != num_x + num_groups:
        return MilpResult([list(g) for g in groups], "failed", before, before)
    new_groups: list[list[Slice]] = [list(group) for group in staying]
    for j, (_, unit) in enumerate(movable):
        target = max(by_item[j], key=lambda c: (values[c], -abs(cols[c][1] - movable[j][0])))
        new_groups[cols[target][1]].extend(unit)
    after = overload(new_groups) if all(new_groups) else float("inf")
    if after >= before * (1 - 1e-9):
        return MilpResult([list(g) for g in groups], "kept", before, before)
    return MilpResult(new_groups, "improved", before, after)
