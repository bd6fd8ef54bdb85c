"""``slimpack``: the SlimPack planner (arXiv 2509.26246) with simulator-in-the-loop selection.

Per step:
1. Phase 1 (``phase1``): samples spread over DP replicas by forward+backward cost; outliers that
   would dominate a replica, or that one pipeline cannot hold, go to merged replicas (DP-Merge).
2. Phase 2 (``groups``/``partition``), per pipeline: samples laid out longest first (so sliced
   samples' chains sit at the front, where their forwards overlap the pipeline's warm-up), cut into
   K forward MicroPacks of equal forward cost, slicing samples at the cuts; the same slices are
   regrouped into K backward MicroPacks of equal backward cost (asymmetric partitioning); the
   per-stage order is the dependency-aware 1F1B under the memory cap.
3. Candidates (K, the DP-Merge threshold, the schedule's look-ahead) are scored by the simulator;
   the fastest plan that fits in memory wins (if none fits, the one with the least memory).
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.errors import UserError
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice, segments
from slimpack.schedule.builders import backward_needs, dependency_aware
from slimpack.schedule.default import activation_cap_bytes
from slimpack.sim import simulate
from slimpack.strategies.slimpack.groups import asymmetric_groups, formations, symmetric_backward
from slimpack.strategies.slimpack.milp import MilpResult, rebalance
from slimpack.strategies.slimpack.partition import CutRules, SliceCost, cut_into_groups
from slimpack.strategies.slimpack.phase1 import Bin, balance, plan_merges

GROUPS_PER_STAGE = (2, 4, 8, 16, 32)
"""Candidate K = multiples of pp; the best is refined by its neighbours."""
MERGE_SHARES = (None, 1.0, 0.5)
"""DP-Merge thresholds tried: an outlier costing more than this share of a replica's work merges."""
LOOKAHEADS = (0, 2)
"""Extra forwards a stage may run ahead of 1F1B (memory permitting)."""
HEAVY_HEAD = 0.05
"""Try balancing for the last stage when the LM head adds more than this to its per-token work."""
SCORE_PIPELINES = 2
"""The most loaded pipelines simulated per candidate (plus those with the most tokens and the
longest sample, for memory)."""


@dataclass(slots=True)
class MilpBudget:
    """The MILP refinement's share of one plan: a deadline for all its solves, and their results."""

    deadline: float
    results: list[MilpResult] = field(default_factory=list)


class Shape(NamedTuple):
    """One candidate shape of a pipeline's plan."""

    num_groups: int
    lookahead: int = 0
    head_weight: float = 0.0
    """1.0 balances groups on the last stage's cost (layers + LM head + loss) instead of a middle
    stage's: with a large vocabulary the last stage is the bottleneck and its per-token head work
    makes token-heavy groups its slowest."""


class SlimPackPlanner:
    name = "slimpack"

    def __init__(self, config: Config) -> None:
        if config.parallel.virtual_stages > 1:
            raise UserError("slimpack: its dependency-aware schedule runs one model chunk per stage; "
                            f"interleaving (virtual_stages = {config.parallel.virtual_stages}) is not supported")
        self.config = config
        self.cost = CostModel(config)
        knobs = config.planner
        self.rules = CutRules(can_cut=knobs.use_slicing, min_slice=knobs.min_slice_tokens,
                              align=knobs.slice_align)
        self.cap = activation_cap_bytes(config, self.cost)
        self._built: dict[tuple, PipelinePlan] = {}

    # ---- costs ----------------------------------------------------------------------------
    def _slice_costs(self, head_weight: float) -> tuple[SliceCost, SliceCost]:
        """(forward, backward) cost functions that groups are balanced on."""
        return tuple(self.cost.slice_cost_function(  # type: ignore[return-value]
            backward=b, extra_per_token=head_weight * self.cost.head_cost_per_token(backward=b))
            for b in (False, True))

    def _ways_for_memory(self, length: int) -> int:
        """Fewest merged replicas whose context parallelism lets one pipeline hold a whole sliced
        sample's activations on stage 0 (all its forwards run before its first backward)."""
        assert self.cap is not None
        per_replica = self.cost.activation_bytes(length, virtual_stage=0)
        return max(1, -(-int(per_replica) // max(1, int(self.cap))))

    def _head_is_heavy(self) -> bool:
        """Whether the LM head adds more than 5% to the last stage's per-token work."""
        per_token = self.cost.slice_cost(1.0, 0.0, backward=False)
        return self.cost.head_cost_per_token(backward=False) > HEAVY_HEAD * per_token

    # ---- phase 2 --------------------------------------------------------------------------
    def _group_cost(self, group: Sequence[Slice], *, backward: bool) -> float:
        return self.cost.group_constant(backward=backward) + sum(
            self.cost.slice_cost(tokens, prefix, backward=backward) for tokens, prefix in segments(group))

    def _refine(self, groups: list[list[Slice]], *, backward: bool, milp: MilpBudget) -> list[list[Slice]]:
        """The MILP's refinement of ``groups``, within what is left of the plan's MILP time."""
        left = milp.deadline - time.perf_counter()
        if left <= 0:
            milp.results.append(MilpResult([list(g) for g in groups], "out of time", 0.0, 0.0))
            return groups
        result = rebalance(groups, lambda g: self._group_cost(g, backward=backward),
                           lambda s: self.cost.slice_cost(s.tokens, s.start, backward=backward),
                           time_limit_s=left)
        milp.results.append(result)
        return result.groups

    def _pipeline(self, bin_: Bin, samples: Sequence[Sample], shape: Shape,
                  milp: MilpBudget | None = None) -> PipelinePlan:
        """The pipeline's groups and order. With ``milp``, the MILP refines the heuristic's groups
        and the refinement is kept only if it does not make the pipeline's simulated step slower
        (the MILP balances group costs; the simulator also sees what that does to the schedule)."""
        heuristic = self._build(bin_, samples, shape)
        if milp is None or not heuristic.forward:
            return heuristic
        if time.perf_counter() >= milp.deadline:
            milp.results.append(MilpResult([], "out of time", 0.0, 0.0))
            return heuristic
        refined = self._build(bin_, samples, shape, milp)
        if refined == heuristic:
            return heuristic
        if self._simulate([(bin_, refined)], samples)[1] < self._simulate([(bin_, heuristic)], samples)[1]:
            return refined
        milp.results.append(MilpResult([], "rejected by simulation", 0.0, 0.0))
        return heuristic

    def _build(self, bin_: Bin, samples: Sequence[Sample], shape: Shape,
               milp: MilpBudget | None = None) -> PipelinePlan:
        """The heuristic pipeline (memoised within a step: scoring builds the winning shape's
        heaviest pipelines first), or its MILP refinement."""
        key = (bin_.replicas, bin_.items, shape)
        if milp is None and key in self._built:
            return self._built[key]
        pipeline = self._construct(bin_, samples, shape, milp)
        if milp is None:
            self._built[key] = pipeline
        return pipeline

    def _construct(self, bin_: Bin, samples: Sequence[Sample], shape: Shape,
                   milp: MilpBudget | None) -> PipelinePlan:
        members = sorted((samples[i] for i in bin_.items), key=lambda s: (-s.length, s.id))
        cp = self.config.parallel.cp * len(bin_.replicas)
        if not members:  # more replicas than samples: this one only joins the gradient all-reduce
            return PipelinePlan(replicas=bin_.replicas, cp=cp, forward=(), backward=(),
                                order=((),) * self.config.parallel.pp, formations=())
        pieces = [Slice(s.id, 0, s.length) for s in members]
        pp = self.config.parallel.pp
        forward_cost, backward_cost = self._slice_costs(shape.head_weight)
        forward = cut_into_groups(pieces, shape.num_groups, forward_cost, self.rules)
        if milp is not None:
            forward = self._refine(forward, backward=False, milp=milp)
        if self.config.planner.use_asymmetric:
            fwd, bwd = asymmetric_groups(forward, backward_cost, self.rules)
            if milp is not None:
                bwd = tuple(tuple(g) for g in self._refine([list(g) for g in bwd], backward=True, milp=milp))
        else:
            fwd = tuple(tuple(g) for g in forward)
            bwd = symmetric_backward(fwd)
        per_token = self.cost.activation_bytes(1.0, virtual_stage=0, cp=cp)
        order = dependency_aware(
            backward_needs(fwd, bwd), num_forward=len(fwd), pp=pp, lookahead=shape.lookahead,
            forward_bytes=[per_token * sum(s.tokens for s in g) for g in fwd],
            backward_freed_bytes=[per_token * sum(s.tokens for s in g) for g in bwd], cap_bytes=self.cap)
        return PipelinePlan(replicas=bin_.replicas, cp=cp, forward=fwd, backward=bwd, order=order)

    # ---- scoring --------------------------------------------------------------------------
    def _simulate(self, pipelines: Sequence[tuple[Bin, PipelinePlan]], samples: Sequence[Sample]
                  ) -> tuple[bool, float, float]:
        """(fits, step time, peak memory) of a sub-plan made of these pipelines alone."""
        width = sum(len(b.replicas) for b, _ in pipelines)
        config = dataclasses.replace(self.config, parallel=dataclasses.replace(self.config.parallel, dp=width))
        renumbered, next_replica = [], 0
        for b, pipe in pipelines:
            renumbered.append(dataclasses.replace(pipe, replicas=tuple(range(next_replica, next_replica + len(b.replicas)))))
            next_replica += len(b.replicas)
        members = [samples[i] for b, _ in pipelines for i in b.items]
        result = simulate(Plan(config=config, strategy=self.name, samples=tuple(members),
                               pipelines=tuple(renumbered)), CostModel(config), check=False)
        return not result.oom, result.step_time_s, max(result.peak_memory_bytes)

    def _score(self, bins: Sequence[Bin], samples: Sequence[Sample], shape: Shape) -> tuple[bool, float, float]:
        """(fits, step time, peak memory) of ``bins``' pipelines built with ``shape``."""
        return self._simulate([(b, self._build(b, samples, shape)) for b in bins], samples)

    def _search(self, bins: Sequence[Bin], samples: Sequence[Sample]
                ) -> tuple[tuple[bool, float, float], Shape, int]:
        """Best (score, shape, candidates tried) for these bins: a coarse sweep of K, then K's
        neighbours, then the look-aheads (and the last-stage balance) at the best, scored on the
        pipelines that decide step time and memory."""
        # the most loaded pipelines decide the step time; the ones with the longest sample or the
        # most tokens decide the peak memory
        heavy = sorted(range(len(bins)), key=lambda b: (-bins[b].load / len(bins[b].replicas), b))
        tokens_of = [sum(samples[i].length for i in b.items) / len(b.replicas) for b in bins]
        longest = [max((samples[i].length for i in b.items), default=0) / len(b.replicas) for b in bins]
        picked = {*heavy[:SCORE_PIPELINES], max(range(len(bins)), key=lambda b: (tokens_of[b], -b)),
                  max(range(len(bins)), key=lambda b: (longest[b], -b))}
        scored_bins = [bins[b] for b in sorted(picked)]
        pp = self.config.parallel.pp
        most_samples = max(len(b.items) for b in bins)
        tokens = max(sum(samples[i].length for i in b.items) for b in bins)
        limit = max(1, min(tokens // self.rules.min_slice + most_samples, 64 * pp))
        scores: dict[Shape, tuple[bool, float, float]] = {}

        def evaluate(candidates: set[Shape]) -> Shape:
            for shape in sorted(candidates - scores.keys()):
                scores[shape] = self._score(scored_bins, samples, shape)
            return min(scores, key=lambda c: (not scores[c][0], scores[c][1] if scores[c][0] else scores[c][2], c))

        k = evaluate({Shape(min(limit, m * pp)) for m in GROUPS_PER_STAGE}).num_groups
        k = evaluate({Shape(max(1, round(k * f))) for f in (0.7, 1.0, 1.4)}).num_groups
        knobs = self.config.planner
        best = evaluate({Shape(k, la) for la in (LOOKAHEADS if knobs.use_lookahead else (0,))})
        if self._head_is_heavy():
            best = evaluate({best, best._replace(head_weight=1.0)})
        return scores[best], best, len(scores)

    # ---- the step -------------------------------------------------------------------------
    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        began = time.perf_counter()
        self._built.clear()  # keys hold indices into this step's batch
        samples = list(batch)
        par = self.config.parallel
        knobs = self.config.planner
        forward_cost, backward_cost = self._slice_costs(0.0)
        costs = [forward_cost(s.length, 0) + backward_cost(s.length, 0) for s in samples]
        loads = costs if knobs.use_cost_balance else [float(s.length) for s in samples]
        min_ways = [self._ways_for_memory(s.length) if knobs.use_dp_merge else 1 for s in samples]
        best = None
        tried = 0
        layouts: set[tuple] = set()
        for share in MERGE_SHARES if knobs.use_dp_merge else (None,):
            merges = plan_merges(costs, par.dp, merge_share=share, min_ways=min_ways)
            bins = balance(loads, par.dp, merges)
            layout = tuple((b.replicas, b.items) for b in bins)
            if layout in layouts:
                continue  # this threshold merges nothing new
            layouts.add(layout)
            score, shape, count = self._search(bins, samples)
            tried += count
            rank = (not score[0], score[1] if score[0] else score[2])
            if best is None or rank < best[0]:
                best = (rank, bins, shape, share, len(merges))
        assert best is not None
        _, bins, shape, share, num_merged = best
        milp = MilpBudget(time.perf_counter() + knobs.milp_time_limit_s) if knobs.use_milp else None
        # formations are reported in the plan only (scoring does not need them)
        pipelines = tuple(dataclasses.replace(pipe, formations=formations(pipe.forward))  # type: ignore[arg-type]
                          for pipe in (self._pipeline(b, samples, shape, milp) for b in bins))
        info = {"num_groups": shape.num_groups, "lookahead": shape.lookahead,
                "head_weight": shape.head_weight,
                "merge_share": share,
                "merged_pipelines": num_merged, "candidates": tried,
                "milp": _milp_summary(milp.results if milp else None), "planner_time_s": time.perf_counter() - began}
        return Plan(config=self.config, strategy=self.name, step=step, samples=tuple(samples),
                    pipelines=pipelines, info=info)


def _milp_summary(results: list[MilpResult] | None) -> dict | None:
    """How the MILP refinement went over all pipelines (None when it is switched off)."""
    if results is None:
        return None
    statuses = [r.status for r in results]
    before = sum(r.before for r in results)
    after = sum(r.after for r in results)
    return {status: statuses.count(status) for status in sorted(set(statuses))} | {
        "overload_before_s": before, "overload_after_s": after}
