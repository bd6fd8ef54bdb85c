"""``slimpack``: the SlimPack planner (arXiv 2509.26246) with simulator-in-the-loop selection.

Per step:
1. Phase 1 (``phase1``): samples spread over DP replicas by forward+backward cost; outliers that
   would dominate a replica, or that one pipeline cannot hold, go to merged replicas (DP-Merge).
2. Phase 2 (``groups``/``partition``), per pipeline: samples laid out longest first (so sliced
   samples' chains sit at the front, where their forwards overlap the pipeline's warm-up), cut into
   K forward MicroPacks of equal forward cost, slicing samples at the cuts; the same slices are
   regrouped into K backward MicroPacks of equal backward cost (asymmetric partitioning, or a
   bounded or symmetric grouping); the per-stage order is the dependency-aware 1F1B under each
   stage's memory cap.
3. Candidates (K, the backward grouping, slicing, the DP-Merge threshold and the merged pipeline's
   share, the schedule's look-ahead) are scored by the simulator; the fastest that fits wins.
4. Every pipeline is checked for memory (and rebuilt down a fallback ladder if it does not fit);
   the whole plan is compared with whole-document baseline packings (``candidates``) and, where
   memory throttles it, with the batch planned on merged replicas (``merged``); the fastest plan
   that fits is returned, or one error says what would make one fit.
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from slimpack.collector import collector_paused
from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.errors import UserError
from slimpack.plan.types import Group, PipelinePlan, Plan, Sample, Slice, group_tokens, runs
from slimpack.schedule.builders import (
    backward_needs,
    chain_lookahead,
    dependency_aware,
    interleaved_1f1b,
)
from slimpack.schedule.default import activation_cap_tokens, interleaved_order
from slimpack.sim import pipelines_step_and_peak, pipelines_step_time, step_time
from slimpack.strategies.slimpack.candidates import (
    CANDIDATES_MAX_SAMPLES,
    plan_peaks,
    safest_plan,
)
from slimpack.strategies.slimpack.cutting import CutRules, SliceCost, cut_into_groups
from slimpack.strategies.slimpack.groups import asymmetric_groups, formations, symmetric_backward
from slimpack.strategies.slimpack.memory import fits
from slimpack.strategies.slimpack.merged import merge_widths, on_merged_replicas, throttled, widened
from slimpack.strategies.slimpack.milp import MilpResult, rebalance
from slimpack.strategies.slimpack.phase1 import Bin, balance, plan_merges
from slimpack.strategies.slimpack.shape import ASYMMETRIC, BOUNDED, SYMMETRIC, Score, Shape, rank

GROUPS_PER_STAGE = (2, 4, 8, 16, 32)
"""Candidate K = multiples of pp; the best is refined by its neighbours."""
MERGE_SHARES = (None, 1.0, 0.5)
"""DP-Merge thresholds tried: an outlier costing more than this share of a replica's work merges."""
SEARCH_AGAIN_WITHIN = 0.01
"""A merge share other than the best score's, whose plan builds within this share of the fastest
plan of the step, has its shapes searched again on its own re-balanced layout (``_searched_again``).
Searching every share's layout again lifted more plans, at up to a third more planner time on
merging layouts; within 1% kept the largest gains for about 1% more (docs/slimpack.md)."""
LOOKAHEADS = (0, 2)
"""Extra forwards a stage may run ahead of 1F1B (memory permitting); the search adds the look-ahead
that the best shape's longest chain of sliced samples asks for (``_chain_lookahead``)."""
TIGHT_MEMORY = 0.8
"""Where SlimPack's plan fills more than this share of usable memory its schedule is throttled by
the cap, and the batch is also planned on merged replicas (``_on_merged_replicas``)."""
HEAVY_HEAD = 0.05
"""Try balancing for the last stage when the LM head adds more than this to its per-token work."""
SCORE_PIPELINES = 2
"""The most loaded pipelines simulated per candidate (plus those with the most tokens and the
longest sample, for memory)."""
FULL_SEARCH_EVERY = 128
"""Steps whose number is a multiple of this run the full candidate search; the others search
around the previous step's winner (about a third of the candidates). Consecutive batches of one
stream are alike, and the seeded search walks: over 16-40 steps of five regimes its plans simulate
0.2% faster to 0.1% slower on average than a full search on every step (-3.5% to +2.6% on single
steps; docs/planner-latency.md), at half the planning time. So the full search runs rarely: at
step 0, and often enough that seeking a stream replays a bounded number of steps."""
SLOW_PIPELINE = 0.02
"""A final pipeline simulating this much slower than its shape's score is tried with other shapes."""
RESHAPES = 3
"""How many of the next ranked shapes such a pipeline tries."""
LOOKAHEAD_LEADERS = 3
"""How many of the best shapes before the look-ahead step try the look-aheads."""
EXACT_RANKS = max(LOOKAHEAD_LEADERS, RESHAPES + 1)
"""The candidates whose rank the plan reads (the winner, the look-ahead leaders, the shapes a slow
pipeline is rebuilt with): scoring a worse one stops as soon as it shows it ranks below them."""
MERGE_REBALANCES = 3
"""Times a DP-Merged pipeline's share of the batch is corrected by its simulated finish time."""
MERGE_FINISH_TOLERANCE = 0.02
"""Merged pipelines of a width ending within this share of the reference's step are left as is."""
@dataclass(slots=True)
class MilpBudget:
    """The MILP refinement's share of one plan: a deadline for all its solves, and their results."""

    deadline: float
    results: list[MilpResult] = field(default_factory=list)


class Finalist(NamedTuple):
    """A layout and shape the step may be built with (``_plan``): each merge share's best (of its
    phase-1 and re-balanced layouts, by score), and where that is a re-balanced layout, the shapes
    searched again on it that score better (``_searched_again``)."""

    score: Score
    bins: list[Bin]
    shape: Shape
    merge_share: float | None
    num_merged: int
    scores: dict[Shape, Score]
    """Every shape scored on these bins (the memory fallbacks and the reshaping read their ranks)."""
    merged_speeds: dict[int, float]
    """The merged pipelines' speeds the bins were balanced with (empty: phase 1's own layout)."""


class SlimPackPlanner:
    name = "slimpack"

    stateful = True
    """Its plans depend on earlier steps through the search seed (the previous step's winner)."""
    resets_every = FULL_SEARCH_EVERY
    """The seed is replaced by a full search at every multiple of this step, so a stream seeking
    to step s replays only from the multiple before s (``strategies.stream``)."""

    def __init__(self, config: Config, *, merge_whole_batch: bool = True) -> None:
        """``merge_whole_batch``: where memory throttles the plan, also plan the batch on merged
        replicas (``merged``); off for the planners of those merged layouts themselves."""
        self.config = config
        self.cost = CostModel(config)
        knobs = config.planner
        self.rules = CutRules(can_cut=knobs.use_slicing, min_slice=knobs.min_slice_tokens,
                              align=knobs.slice_align)
        self._built: dict[tuple, PipelinePlan] = {}
        self._coarsened: dict[tuple, PipelinePlan] = {}
        """A merged pipeline per shape, at the group count it runs fastest with (``_pipeline``)."""
        self._grouped: dict[tuple, tuple[tuple[Group, ...], ...]] = {}
        """A bin's (forward, backward) groups per shape but its look-ahead, within a step."""
        self._forward: dict[tuple, list[list[Slice]]] = {}
        """A bin's forward groups per group count, slicing and head weight, within a step."""
        self._linked_caps: dict[int, float] = {}
        self._laid_out: dict[tuple[int, ...], list[Slice]] = {}
        """A bin's samples laid out longest first as whole slices (every shape cuts that sequence)."""
        self._ids = self._lengths = np.zeros(0, dtype=np.int64)
        """This step's sample ids and lengths, by index in the batch."""
        self._seed: Shape | None = None
        """The previous step's winning shape, which seeds this step's search."""
        self._sliced_first: tuple[str, int] | None = None
        """The slice-level candidate (spread, slice count) that last won a step, tried first."""
        self._merge_whole_batch = (merge_whole_batch and config.parallel.dp > 1 and knobs.use_dp_merge
                                   and knobs.use_wide_merge)
        self._replica_nodes = self.cost.replica_nodes(np.arange(config.parallel.dp), stage=0)
        """Per replica, the nodes of its first and last rank: merged groups are placed on one node
        where they can be (``phase1.place_merged``)."""
        first, last = self._replica_nodes
        self._replicas_per_node = int(np.bincount(first[first == last], minlength=1).max())
        """The most replicas one node holds whole (0 where every replica spans nodes)."""
        self._merged: dict[int, SlimPackPlanner] = {}
        """The planners of the layouts with k replicas merged, by k (each keeps its own seed)."""
        self._merge_width: int | None = None
        """How many merged replicas the last step that tried them ran on (None: on its own)."""

    def state_dict(self) -> dict[str, Any]:
        return {"seed": list(self._seed) if self._seed is not None else None, "merge_width": self._merge_width,
                "sliced_first": list(self._sliced_first) if self._sliced_first is not None else None,
                "merged": {str(k): planner.state_dict() for k, planner in self._merged.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seed = Shape(*state["seed"]) if state.get("seed") is not None else None
        width = state.get("merge_width")
        self._merge_width = int(width) if width is not None else None
        first = state.get("sliced_first")
        self._sliced_first = (str(first[0]), int(first[1])) if first is not None else None
        self._merged.clear()
        for k, inner in state.get("merged", {}).items():
            self._merged_planner(int(k)).load_state_dict(inner)

    def _merged_planner(self, k: int) -> SlimPackPlanner:
        if k not in self._merged:
            self._merged[k] = SlimPackPlanner(widened(self.config, k), merge_whole_batch=False)
        return self._merged[k]

    # ---- costs ----------------------------------------------------------------------------
    def _slice_costs(self, head_weight: float) -> tuple[SliceCost, SliceCost]:
        """(forward, backward) cost functions that groups are balanced on."""
        return tuple(self.cost.slice_cost_function(  # type: ignore[return-value]
            backward=b, extra_per_token=head_weight * self.cost.head_cost_per_token(backward=b))
            for b in (False, True))

    def _bounded_cost(self, head_weight: float) -> SliceCost:
        """Backward cost plus forward cost scaled to the same per-token weight: groups balanced on
        it sit between forward-balanced and backward-balanced ones (see BOUNDED)."""
        forward, backward = self._slice_costs(head_weight)
        ratio = backward(4096.0, 0.0) / forward(4096.0, 0.0)
        return lambda tokens, prefix: backward(tokens, prefix) + ratio * forward(tokens, prefix)

    def _longest_held(self) -> list[float]:
        """Per number of merged replicas k (index k-1): the longest sample whose activations one
        pipeline of k merged replicas holds on every stage (a sliced sample's forwards all run
        before its first backward), with a context-length group's working set."""
        par = self.config.parallel
        return [min(activation_cap_tokens(self.config, self.cost, cp=par.cp * k,
                                          largest_group_tokens=self.config.train.max_context))
                for k in range(1, par.dp + 1)]

    def _linked_cap(self, cp: int) -> float:
        """The most tokens a run of groups linked by cut samples may hold (``CutRules``): what
        every stage can keep at once beside a context-length group's working set (per cp, kept on
        the planner: ``tune`` makes a planner per layout, and a class-level cache would keep them all)."""
        if cp not in self._linked_caps:
            self._linked_caps[cp] = max(0.0, min(activation_cap_tokens(
                self.config, self.cost, cp=cp, largest_group_tokens=self.config.train.max_context)))
        return self._linked_caps[cp]

    def _head_is_heavy(self) -> bool:
        """Whether the LM head adds more than 5% to the last stage's per-token work."""
        per_token = self.cost.slice_cost(1.0, 0.0, backward=False)
        return self.cost.head_cost_per_token(backward=False) > HEAVY_HEAD * per_token

    # ---- phase 2 --------------------------------------------------------------------------
    def _group_cost(self, group: Sequence[Slice], *, backward: bool) -> float:
        return self.cost.group_constant(backward=backward) + sum(
            self.cost.slice_cost(run.tokens, run.start, backward=backward) for run in runs(group))

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

    def _best_pipeline(self, bin_: Bin, samples: Sequence[Sample], shape: Shape,
                       milp: MilpBudget | None = None) -> PipelinePlan:
        """The pipeline's groups and order. With ``milp``, the MILP refines the heuristic's groups
        and the refinement is kept only if it fits and does not make the pipeline's simulated step
        slower (the MILP balances group costs; the simulator also sees what that does to the
        schedule)."""
        heuristic = self._pipeline(bin_, samples, shape)
        if milp is None or not heuristic.forward:
            return heuristic
        if time.perf_counter() >= milp.deadline:
            milp.results.append(MilpResult([], "out of time", 0.0, 0.0))
            return heuristic
        refined = self._memo_pipeline(bin_, samples, shape, milp)
        if refined == heuristic:
            return heuristic
        refined_score = self._simulate([refined])
        if refined_score[0] and rank(refined_score) < rank(self._simulate([heuristic])):
            return refined
        milp.results.append(MilpResult([], "rejected by simulation", 0.0, 0.0))
        return heuristic

    def _pipeline(self, bin_: Bin, samples: Sequence[Sample], shape: Shape) -> PipelinePlan:
        """The pipeline the plan runs: the heuristic one; on merged replicas, ``shape`` with its
        group count halved while that fits and runs faster (down to pp). The shape's count is the
        search's for every pipeline, and a merged one spreads each group over its k replicas: a
        256K document alone on 3 merged replicas at tp1 pp4 cp4, cut into the 90 groups the shape
        asks for, ran 14.6 s, with 45, 22, 11 and 5 groups 9.6, 7.5, 7.1 and 8.0 s (wikipedia 256K,
        256 GPUs). Over the merged pipelines of five such layouts the time fell, then rose, as the
        count halved, so the halving stops at the first count that is not faster. Only the plan's
        pipelines are built so: the search and the re-balancing score at the shape's count (with
        coarser merged pipelines the re-balancing moved work onto the others and ended 3% slower
        in tests/strategies/test_slimpack.py's all-merged case), so no pipeline ends later than
        scored. Kept per step."""
        if len(bin_.replicas) == 1:
            return self._memo_pipeline(bin_, samples, shape)
        key = (bin_.replicas, bin_.items, shape)
        if key not in self._coarsened:
            best = self._memo_pipeline(bin_, samples, shape)
            fits_, best_s, _ = self._simulate([best]) if best.forward else (False, 0.0, 0.0)
            count = shape.num_groups // 2
            while fits_ and count >= self.config.parallel.pp:
                coarser = self._memo_pipeline(bin_, samples, shape._replace(num_groups=count))
                coarser_fits, time_s, _ = self._simulate([coarser])
                if not (coarser_fits and time_s < best_s):
                    break
                best, best_s, count = coarser, time_s, count // 2
            self._coarsened[key] = best
        return self._coarsened[key]

    def _memo_pipeline(self, bin_: Bin, samples: Sequence[Sample], shape: Shape,
                       milp: MilpBudget | None = None) -> PipelinePlan:
        """The heuristic pipeline (memoised within a step: scoring builds the winning shape's
        heaviest pipelines first), or its MILP refinement."""
        key = (bin_.replicas, bin_.items, shape)
        if milp is None and key in self._built:
            return self._built[key]
        pipeline = self._cut_pipeline(bin_, samples, shape, milp)
        if milp is None:
            self._built[key] = pipeline
        return pipeline

    def _cut_pipeline(self, bin_: Bin, samples: Sequence[Sample], shape: Shape,
                      milp: MilpBudget | None) -> PipelinePlan:
        """The pipeline ``shape`` asks for: the bin's samples cut into forward groups, regrouped
        for backward (symmetric, asymmetric or bounded), with the MILP's refinement when given."""
        cp = self.config.parallel.cp * len(bin_.replicas)
        if not bin_.items:  # more replicas than samples: this one only joins the gradient all-reduce
            return PipelinePlan(replicas=bin_.replicas, cp=cp, forward=(), backward=(),
                                order=((),) * self.config.parallel.pp, formations=())
        fwd, bwd = self._groups(bin_, shape, cp, milp)
        return PipelinePlan(replicas=bin_.replicas, cp=cp, forward=fwd, backward=bwd,
                            order=self._order(fwd, bwd, cp, shape.lookahead))

    def _groups(self, bin_: Bin, shape: Shape, cp: int, milp: MilpBudget | None) -> tuple[tuple[Group, ...], ...]:
        """(forward, backward) groups of the bin's samples for ``shape``. Without the MILP they are
        memoised within a step: the look-ahead changes only the order, and the backward mode only
        the backward groups (the search scores each of them at the same group count)."""
        key = (bin_.replicas, bin_.items, shape._replace(lookahead=0))
        if milp is None and key in self._grouped:
            return self._grouped[key]
        _, backward_cost = self._slice_costs(shape.head_weight)
        forward = self._forward_groups(bin_, shape, cp) if milp is None else [
            list(g) for g in self._refine(self._forward_groups(bin_, shape, cp), backward=False, milp=milp)]
        if shape.backward == SYMMETRIC:
            fwd = tuple(map(tuple, forward))
            bwd = symmetric_backward(fwd)
        else:
            balance_on = backward_cost if shape.backward == ASYMMETRIC else self._bounded_cost(shape.head_weight)
            fwd, bwd = asymmetric_groups(forward, balance_on, self._rules(shape, cp))
            if milp is not None:
                bwd = tuple(tuple(g) for g in self._refine([list(g) for g in bwd], backward=True, milp=milp))
        if milp is None:
            self._grouped[key] = fwd, bwd
        return fwd, bwd

    def _forward_groups(self, bin_: Bin, shape: Shape, cp: int) -> list[list[Slice]]:
        """The bin's samples, longest first, cut into ``shape``'s forward groups (memoised within a
        step: every backward mode of a group count cuts the same forward groups). Read only."""
        key = (bin_.replicas, bin_.items, shape.num_groups, shape.slicing, shape.head_weight)
        if key not in self._forward:
            if bin_.items not in self._laid_out:
                items = np.array(bin_.items, dtype=np.intp)
                ids, lengths = self._ids[items], self._lengths[items]
                order = np.lexsort((ids, -lengths))  # longest first, then by id
                # tuple.__new__ makes the slices in C (the named tuple's own constructor is Python)
                whole = zip(ids[order].tolist(), repeat(0), lengths[order].tolist(), strict=False)
                self._laid_out[bin_.items] = list(map(partial(tuple.__new__, Slice), whole))
            forward_cost, _ = self._slice_costs(shape.head_weight)
            self._forward[key] = cut_into_groups(self._laid_out[bin_.items], shape.num_groups, forward_cost,
                                                 self._rules(shape, cp))
        return self._forward[key]

    def _rules(self, shape: Shape, cp: int) -> CutRules:
        """The cutting rules of ``shape`` on a pipeline of context-parallel degree ``cp``."""
        return (dataclasses.replace(self.rules, max_linked_tokens=self._linked_cap(cp)) if shape.slicing
                else dataclasses.replace(self.rules, can_cut=False))

    def _order(self, forward: Sequence[Sequence[Slice]], backward: Sequence[Sequence[Slice]], cp: int,
               lookahead: int) -> tuple:
        """The dependency-aware order under each stage's memory cap. Under interleaving: Megatron's
        interleaved 1F1B for symmetric groups in rounds of pp, else the list-scheduled order, which
        runs any groups (sliced samples, asymmetric backward, any count)."""
        par = self.config.parallel
        if par.virtual_stages > 1:
            if forward == backward and len(forward) % par.pp == 0:
                return interleaved_1f1b(len(forward), par.pp, par.virtual_stages)
            return interleaved_order(forward, backward, cp=cp, config=self.config, cost=self.cost)
        forward_tokens = list(map(group_tokens, forward))
        backward_tokens = list(map(group_tokens, backward))
        caps = activation_cap_tokens(self.config, self.cost, cp=cp,
                                     largest_group_tokens=max(forward_tokens + backward_tokens))
        return dependency_aware(backward_needs(forward, backward), num_forward=len(forward),
                                pp=self.config.parallel.pp, lookahead=lookahead,
                                forward_tokens=forward_tokens, backward_tokens=backward_tokens, cap_tokens=caps)

    def _fits(self, pipeline: PipelinePlan) -> bool:
        return pipeline.order is not None and fits(pipeline, pipeline.order, self.config, self.cost)

    # ---- scoring --------------------------------------------------------------------------
    def _simulate(self, pipelines: Iterable[PipelinePlan], *, give_up_at: float = float("inf")) -> Score:
        """(fits, step time, peak memory) of a sub-plan made of these pipelines alone. The layout
        keeps its full dp, so the gradient all-reduce costs what it costs in the whole plan. With
        ``give_up_at``, the pipelines (built as they are asked for) stop being simulated once the
        step passes it: the score is then a lower bound above ``give_up_at``, which ranks the
        candidate behind every fitting one that is not slower than ``give_up_at``."""
        step_s, peak = pipelines_step_and_peak(self.config, enumerate(pipelines), self.cost, give_up_at=give_up_at)
        return peak <= self.config.cluster.usable_memory_bytes, step_s, peak

    def _score(self, bins: Sequence[Bin], samples: Sequence[Sample], shape: Shape, *,
               give_up_at: float = float("inf")) -> Score:
        """(fits, step time, peak memory) of ``bins``' pipelines built with ``shape``, in the order
        given (``_scored_bins``: the most loaded first, the likeliest to reach ``give_up_at``)."""
        return self._simulate((self._memo_pipeline(b, samples, shape) for b in bins), give_up_at=give_up_at)

    def _scored_bins(self, bins: Sequence[Bin], samples: Sequence[Sample]) -> list[Bin]:
        """The pipelines that decide a candidate's score, the most loaded first: the most loaded
        ones (step time) and the ones with the longest sample or the most tokens (peak memory)."""
        heavy = sorted(range(len(bins)), key=lambda b: (-bins[b].load / len(bins[b].replicas), b))
        held = [self._lengths[list(b.items)] for b in bins]
        tokens_of = [int(h.sum()) / len(b.replicas) for h, b in zip(held, bins, strict=True)]
        longest = [int(h.max(initial=0)) / len(b.replicas) for h, b in zip(held, bins, strict=True)]
        merged = {b for b in range(len(bins)) if len(bins[b].replicas) > 1}  # their speed is estimated
        picked = {*heavy[:SCORE_PIPELINES], max(range(len(bins)), key=lambda b: (tokens_of[b], -b)),
                  max(range(len(bins)), key=lambda b: (longest[b], -b)), *merged}
        return [bins[b] for b in heavy if b in picked]  # the most loaded first

    @staticmethod
    def _give_up_at(scores: dict[Shape, Score], shape: Shape) -> float:
        """Where scoring ``shape`` may stop: the EXACT_RANKS-th fastest fitting time so far. A
        candidate that passes it can rank no better than EXACT_RANKS-th, so the ranks the plan
        reads (the winner, the look-ahead leaders, the reshape shapes) stay exact; the lower ranks
        may change order, which only the memory fallback ladder reads (it checks every shape it
        tries). Whole-sample shapes are scored in full: their step is the lead that decides
        whether the baseline candidates are built."""
        times = sorted(time_s for fits_, time_s, _ in scores.values() if fits_)
        if not shape.slicing or len(times) < EXACT_RANKS:
            return float("inf")
        return times[EXACT_RANKS - 1]

    def _chain_lookahead(self, bins: Sequence[Bin], samples: Sequence[Sample], shape: Shape) -> int:
        """The look-ahead that keeps ``shape``'s pipelines full across their longest chain."""
        return max(chain_lookahead(backward_needs(pipe.forward, pipe.backward))
                   for pipe in (self._memo_pipeline(b, samples, shape) for b in bins))

    def _search(self, bins: Sequence[Bin], samples: Sequence[Sample], seed: Shape | None) -> dict[Shape, Score]:
        """Every candidate scored for these bins: a coarse sweep of K with asymmetric and symmetric
        backward groups, then the best K's neighbours, the bounded asymmetry, the look-aheads, the
        last-stage balance and whole samples at the best shape. With a ``seed`` (the previous
        step's winner: consecutive batches of one stream are alike) only its neighbourhood."""
        scored_bins = self._scored_bins(bins, samples)
        pp = self.config.parallel.pp
        most_samples = max(len(b.items) for b in bins)
        tokens = max(int(self._lengths[list(b.items)].sum()) for b in bins)
        finest = tokens // self.rules.min_slice + most_samples
        limit = max(1, min(finest, 64 * pp))
        # one context-length sequence per group is what fixed-length packing runs: at short contexts
        # and many tokens per GPU that is finer than 64 groups per stage, and worth trying
        sequences = min(finest, -(-tokens // self.config.train.max_context))
        scores: dict[Shape, Score] = {}

        def evaluate(candidates: set[Shape]) -> Shape:
            for shape in sorted(candidates - scores.keys()):
                scores[shape] = self._score(scored_bins, samples, shape, give_up_at=self._give_up_at(scores, shape))
            return min(scores, key=lambda c: (rank(scores[c]), c))

        knobs = self.config.planner
        # the look-ahead is a knob of the dependency-aware 1F1B; the interleaved orders have none
        with_lookahead = knobs.use_lookahead and self.config.parallel.virtual_stages == 1

        def lookaheads(best: Shape) -> set[int]:
            if not with_lookahead:
                return {0}
            # a chain's look-ahead only where it is longer than those tried anyway: a new value
            # changes which shape the later steps of this greedy search start from
            chain = self._chain_lookahead(scored_bins, samples, best)
            return {*LOOKAHEADS, chain} if chain > max(LOOKAHEADS) else set(LOOKAHEADS)
        modes = (ASYMMETRIC, SYMMETRIC) if knobs.use_asymmetric else (SYMMETRIC,)
        if seed is not None:
            best = evaluate({seed._replace(num_groups=max(1, min(max(limit, sequences), round(seed.num_groups * f))))
                             for f in (0.8, 1.0, 1.25)})
            others = {best._replace(backward=mode) for mode in (*modes, BOUNDED)[:len(modes) + knobs.use_asymmetric]}
            if knobs.use_slicing:
                others.add(best._replace(slicing=not best.slicing, backward=SYMMETRIC if best.slicing else ASYMMETRIC))
            best = evaluate(others)
            evaluate({best._replace(lookahead=la) for la in lookaheads(best)})
            return scores
        best = evaluate({Shape(min(limit, m * pp), mode) for m in GROUPS_PER_STAGE for mode in modes})
        best = evaluate({best._replace(num_groups=max(1, round(best.num_groups * f))) for f in (0.7, 1.0, 1.4)})
        if knobs.use_asymmetric:
            best = evaluate({best, best._replace(backward=BOUNDED)})
        best = evaluate({best._replace(lookahead=la) for la in lookaheads(best)})
        if self._head_is_heavy():
            best = evaluate({best, best._replace(head_weight=1.0)})
        plain = {best.lookahead} if best.lookahead in LOOKAHEADS else set(LOOKAHEADS)
        if knobs.use_slicing:  # whole samples form no chains: a chain's look-ahead becomes the plain ones
            evaluate({best._replace(slicing=False, backward=SYMMETRIC, lookahead=la) for la in plain})
        # Beyond the greedy path above (scored after it, so they can only add to what it found):
        # the look-aheads for the runners-up (K and look-ahead interact: a finer K can lose without
        # look-ahead and win with it), and finer counts where one context-length sequence per group
        # is finer than the sweep: that count, and doubling from 64 per stage towards it. At short
        # contexts and many tokens per GPU the best count lay between, with groups of several
        # sequences (short-context cells of docs/baseline-caps.md, up to 1.8x faster), so a finer
        # count that wins is refined as the sweep's best is
        leaders = sorted(scores, key=lambda c: (rank(scores[c]), c))[:LOOKAHEAD_LEADERS]
        extra = {s._replace(lookahead=la) for s in leaders for la in lookaheads(s)}
        finer: set[int] = set()
        if sequences > max(GROUPS_PER_STAGE) * pp:
            finer.add(sequences)
            count = 2 * max(GROUPS_PER_STAGE) * pp
            while count < min(sequences, finest):
                finer.add(count)
                count *= 2
            extra |= {Shape(k, mode) for k in finer for mode in modes}
            extra |= {Shape(sequences, SYMMETRIC, slicing=False, lookahead=la) for la in plain}
        best = evaluate(extra)
        if best.num_groups in finer:
            best = evaluate({best._replace(num_groups=max(1, round(best.num_groups * f))) for f in (0.7, 1.4)})
            evaluate({best._replace(lookahead=la) for la in lookaheads(best)})
        if self.config.parallel.virtual_stages > 1:  # scored last, so they only add to what was found
            ranked = sorted(scores, key=lambda c: (rank(scores[c]), c))
            whole_best = [c for c in ranked if not c.slicing][:1]
            evaluate({s._replace(num_groups=k) for s in ranked[:LOOKAHEAD_LEADERS] + whole_best
                      for k in self._in_rounds(s, bins)})
        return scores

    def _in_rounds(self, shape: Shape, bins: Sequence[Bin]) -> set[int]:
        """Under interleaving, the group counts next to ``shape``'s that are multiples of pp (whole
        samples: the one below its count or the fewest samples of a pipeline, whichever is less).
        The interleaved order runs groups in rounds of pp, and a count off a multiple leaves a part
        round: in an out-of-band probe cell (llama2-70b, 8K, tp4 pp8 vpp2 dp8, 75 documents per
        replica) whole samples ran 17.03 s as 75 groups (one per sample, where the shape asked for
        128), 17.24 s as 70 and 14.36 s as 72; at pp 2 an odd count cost 0.1-0.7% (stress cells 18
        and 157). Replacing the counts instead made some plans slower or unfit (fewer, larger
        whole-sample groups hold more memory): they are extra candidates."""
        pp = self.config.parallel.pp
        count = shape.num_groups if shape.slicing else min(shape.num_groups, min(len(b.items) for b in bins))
        below = count // pp * pp
        return {k for k in ({below, below + pp} if shape.slicing else {below}) if k >= pp and k != shape.num_groups}

    def _merged_speeds(self, loads: Sequence[float], merges: Sequence[tuple[int, int]], min_ways: Sequence[int],
                       samples: Sequence[Sample], bins: Sequence[Bin], shape: Shape
                       ) -> list[tuple[dict[Shape, Score], list[Bin], dict[int, float]]]:
        """DP-Merge that ends with everyone: phase 1 first counts k merged replicas as k replicas'
        speed; merged pipelines then simulate slower (context parallelism, the outlier's chain, a
        group wider than a node on the slower link), so their speed is corrected by the simulated
        ratio of their finish to the reference's and the batch re-balanced, a few times: once with
        one speed for every merged pipeline against the heaviest single replica, and, where merged
        pipelines differ in width, once with a speed per width (against the heaviest single replica
        or, where every replica is merged, the width that holds the most replicas). Neither series
        wins everywhere: a width's own speed follows its finish more closely, but the layouts it
        gives can exceed memory where the common speed's do not. Each re-balanced layout, scored
        with ``shape``, with the speeds it was balanced with."""
        # speed classes of a pipeline's width: single replicas (1) and all merged widths together (0)
        out = self._rebalanced(loads, merges, min_ways, samples, bins, shape, lambda k: k if k == 1 else 0)
        if len({k for _, k in merges}) > 1:
            out += self._rebalanced(loads, merges, min_ways, samples, bins, shape, lambda k: k)
        return out

    def _rebalanced(self, loads: Sequence[float], merges: Sequence[tuple[int, int]], min_ways: Sequence[int],
                    samples: Sequence[Sample], bins: Sequence[Bin], shape: Shape, speed_class: Callable[[int], int]
                    ) -> list[tuple[dict[Shape, Score], list[Bin], dict[int, float]]]:
        """The re-balancing series of ``_merged_speeds`` where the pipelines of one ``speed_class``
        (of their width) share a speed."""
        out = []
        speeds: dict[int, float] = {}
        for _ in range(MERGE_REBALANCES):
            classes: dict[int, list[Bin]] = {}
            for b in bins:
                classes.setdefault(speed_class(len(b.replicas)), []).append(b)
            if len(classes) < 2:
                break
            finish = {c: self._finish_s(group, samples, shape) for c, group in classes.items()}
            ref = 1 if 1 in classes else max(classes, key=lambda c: (sum(len(b.replicas) for b in classes[c]), -c))
            late = {c: s for c, s in finish.items() if abs(s - finish[ref]) > MERGE_FINISH_TOLERANCE * finish[ref]}
            if not late:
                break
            for k in {len(b.replicas) for b in bins if speed_class(len(b.replicas)) in late}:
                speeds[k] = speeds.get(k, 1.0) * finish[ref] / late[speed_class(k)]
            bins = balance(loads, self.config.parallel.dp, merges, merged_speed=speeds, min_ways=min_ways,
                           nodes=self._replica_nodes)
            out.append(({shape: self._score(self._scored_bins(bins, samples), samples, shape)}, bins, dict(speeds)))
        return out

    def _finish_s(self, pipelines: Sequence[Bin], samples: Sequence[Sample], shape: Shape) -> float:
        """When the slowest of these pipelines ends, alone: for single replicas the heaviest one's
        (they differ by load only), for merged ones each is simulated (their outliers differ)."""
        if len(pipelines[0].replicas) == 1:
            pipelines = [max(pipelines, key=lambda b: (b.load, -b.replicas[0]))]
        return max(self._simulate([self._memo_pipeline(b, samples, shape)])[1] for b in pipelines)

    def _reshape_slow(self, bins: Sequence[Bin], pipelines: Sequence[PipelinePlan], samples: Sequence[Sample],
                      ranked: Sequence[Shape], expected_s: float, bounded: Collection[int] = ()
                      ) -> tuple[list[PipelinePlan], int, list[float]]:
        """The shape was scored on the pipelines that decide the step (the most loaded, the most
        tokens, the longest sample), yet another can come out slower: its chains or its memory
        differ. Each pipeline that simulates more than SLOW_PIPELINE over the score is rebuilt with
        the next ranked shapes (pipelines need not share a shape) and the fastest that fits stays.
        The ``bounded`` pipelines (indices) are not simulated again: the score already bounds them.
        Returns the pipelines, how many changed, and the simulated step of each pipeline not
        bounded (alone, as kept)."""
        out, reshaped, times = list(pipelines), 0, []
        for i, (bin_, pipe) in enumerate(zip(bins, pipelines, strict=True)):
            if i in bounded:
                continue
            best_s = pipelines_step_time(self.config, [(0, pipe)], self.cost)
            if best_s > (1 + SLOW_PIPELINE) * expected_s:
                for other in [s for s in ranked if s != ranked[0]][:RESHAPES]:
                    candidate = self._memo_pipeline(bin_, samples, other)
                    fits_, time_s, _ = self._simulate([candidate])
                    if fits_ and time_s < best_s:
                        out[i], best_s = candidate, time_s
            reshaped += out[i] is not pipe
            times.append(best_s)
        return out, reshaped, times

    def _fallbacks(self, shape: Shape, ranked: Sequence[Shape]) -> list[Shape]:
        """Shapes to try, in order, for a pipeline that does not fit with ``shape``: the other
        candidates in rank order, then the ladder: no look-ahead, backward groups bounded by the
        forward ones, symmetric groups, finer groups, finer sliced groups, whole samples. Finer
        groups without slicing cannot split the longest sample, whose group then sets the peak
        (on the last stage with its logits): the sliced ones can."""
        ladder = [shape._replace(lookahead=0)]
        ladder += [ladder[-1]._replace(backward=mode) for mode in (BOUNDED, SYMMETRIC)]
        finer = [ladder[-1]._replace(num_groups=shape.num_groups * f) for f in (2, 4)]
        ladder += finer + [s._replace(slicing=True) for s in finer]
        ladder += [ladder[-1]._replace(slicing=False, num_groups=shape.num_groups * f) for f in (1, 2, 4)]
        seen: set[Shape] = {shape}
        return [s for s in [*ranked, *ladder] if not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]

    # ---- the step -------------------------------------------------------------------------
    def plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        with collector_paused():
            return self._plan(batch, step=step)

    def _plan(self, batch: Sequence[Sample], *, step: int) -> Plan:
        began = time.perf_counter()
        for memo in (self._built, self._coarsened, self._grouped, self._forward, self._laid_out):
            memo.clear()  # keys hold indices into this step's batch
        samples = list(batch)
        par = self.config.parallel
        knobs = self.config.planner
        forward_cost, backward_cost = self._slice_costs(0.0)
        self._ids = np.array([s.id for s in samples], dtype=np.int64)
        self._lengths = np.array([s.length for s in samples], dtype=np.int64)
        lengths = self._lengths.astype(np.float64)
        costs = (forward_cost(lengths, 0.0) + backward_cost(lengths, 0.0)).tolist()  # as per sample, bit for bit
        loads = costs if knobs.use_cost_balance else [float(s.length) for s in samples]
        holds = self._longest_held()
        # per sample, the fewest merged replicas whose pipeline holds it (the first k with
        # holds[k-1] >= its length, found on the running maximum of ``holds``; dp if none)
        min_ways = (np.minimum(np.searchsorted(np.maximum.accumulate(holds), lengths) + 1, par.dp).tolist()
                    if knobs.use_dp_merge else [1] * len(samples))
        seed = self._seed if step % FULL_SEARCH_EVERY else None
        share_bests, tried = self._share_bests(samples, costs, loads, min_ways, seed)
        best = min(share_bests, key=lambda f: rank(f.score))
        milp = MilpBudget(time.perf_counter() + knobs.milp_time_limit_s) if knobs.use_milp else None
        finalists, why = [best], ["best score"]
        again, scored = self._searched_again(best, samples, seed)
        finalists += again
        why += ["searched again"] * len(again)
        tried += scored
        # Every other share's best is built too, for the same reason: the shares merge different
        # replicas, so their scores weigh sub-plans of different pipelines. At wikipedia 256K on tp1
        # pp4 cp2 dp32 (256 GPUs, no wide merge, as tune screens it) share 0.5 scored 10.62 s and
        # built 11.18 s, share 1.0 scored 14.17 s and built 10.90 s (docs/slimpack.md)
        own = len(finalists)
        others = [f for f in share_bests if f is not best]
        finalists += others
        why += [f"merge share {f.merge_share}" for f in others]
        built = [self._build(finalist, samples, step, seed, tried, milp) for finalist in finalists]
        # and a share whose plan comes within SEARCH_AGAIN_WITHIN of the fastest is searched again
        # on its own re-balanced layout: there share 1.0's shapes searched again built 10.16 s
        quickest = min((plan.info["step_s"] for plan, fits_, _ in built if fits_), default=float("inf"))
        for other, (other_plan, fits_, _) in zip(others, built[own:], strict=True):
            if fits_ and other_plan.info["step_s"] <= (1 + SEARCH_AGAIN_WITHIN) * quickest:
                again, scored = self._searched_again(other, samples, seed)
                finalists += again
                why += [f"merge share {other.merge_share} searched again"] * len(again)
                built += [self._build(finalist, samples, step, seed, tried + scored, milp) for finalist in again]

        def fastest(count: int) -> int:
            """Of the first ``count`` built finalists, the fastest that fits (else the fastest)."""
            return min(range(count), key=lambda i: (not built[i][1], built[i][0].info["step_s"]))

        kept = fastest(len(built))
        plan, fitting, lead = built[kept]
        plan = dataclasses.replace(plan, info={**plan.info, "finalists": len(finalists), "finalist": why[kept]})
        # the next step's seed is the kept plan's shape among the search's own finalists (the best
        # score and its shapes searched again), never another share's, so the seeded search follows
        # the path it followed before: seeding from another share's winner moved it elsewhere and
        # made one window 2.1% slower (docs/slimpack.md)
        self._seed = finalists[fastest(own)].shape
        try:
            plan = safest_plan(plan, batch, self.cost, fitting=fitting, lead=lead, sliced_first=self._sliced_first)
            won = plan.info.get(plan.info["candidate"], {})
            if "spread" in won:
                self._sliced_first = (won["spread"], won["num_slices"])
        except UserError as no_fit:
            plan = self._on_merged_replicas(None, batch, step, full_search=seed is None)
            if plan is None:
                raise no_fit
        else:
            plan = self._on_merged_replicas(plan, batch, step, full_search=seed is None)
        return dataclasses.replace(plan, info={**plan.info, "planner_time_s": time.perf_counter() - began})

    def _searched_again(self, finalist: Finalist, samples: list[Sample], seed: Shape | None
                        ) -> tuple[list[Finalist], int]:
        """``finalist``'s layout with the shapes searched again on it, where it is a re-balanced
        DP-Merge layout: its shape was searched on phase 1's layout, whose merged pipelines ran
        slower than their estimated speed (at 256K contexts on 64 replicas the search's sub-plans
        stepped 17-30 s, the re-balanced plan 8.1 s). Searched around its shape and, on a
        full-search step, afresh (the seeded search stays near a shape chosen on the distorted
        layout: at wikipedia 256K on tp1 pp4 cp2 dp32 it went from 90 groups to 72 while 45 steps 5%
        faster; docs/slimpack.md). The finalists whose shape scores better than ``finalist`` there
        (built beside it: the scores read the most loaded pipelines only, and a better score has
        come out as a slower plan), and how many candidates were scored."""
        found: list[Finalist] = []
        scored = 0
        if not finalist.merged_speeds:
            return found, scored
        for around in [finalist.shape] + ([None] if seed is None else []):
            again = self._search(finalist.bins, samples, around)
            scored += len(again)
            top = min(again, key=lambda c: (rank(again[c]), c))
            if rank(again[top]) < rank(finalist.score) and all(top != f.shape for f in [finalist, *found]):
                found.append(finalist._replace(score=again[top], shape=top, scores={**finalist.scores, **again}))
        return found, scored

    def _share_bests(self, samples: list[Sample], costs: Sequence[float], loads: Sequence[float],
                     min_ways: Sequence[int], seed: Shape | None) -> tuple[list[Finalist], int]:
        """Per DP-Merge share (one that merges nothing new is skipped: phase 1 would give the same
        bins), its best layout and shape by score: phase 1's layout searched, then its re-balanced
        layouts scored with the winning shape. Also how many candidates were scored."""
        par = self.config.parallel
        bests: list[Finalist] = []
        tried = 0
        tried_merges: list[list[tuple[int, int]]] = []
        for share in MERGE_SHARES if self.config.planner.use_dp_merge else (None,):
            merges = plan_merges(costs, par.dp, merge_share=share, min_ways=min_ways)
            if merges in tried_merges:
                continue
            tried_merges.append(merges)
            bins = balance(loads, par.dp, merges, min_ways=min_ways, nodes=self._replica_nodes)
            scores = self._search(bins, samples, seed)
            tried += len(scores)
            shape = min(scores, key=lambda c: (rank(scores[c]), c))
            candidates: list[tuple[dict[Shape, Score], list[Bin], dict[int, float]]] = [(scores, bins, {})]
            if merges:
                # a re-balanced layout is scored with the winning shape only; the other shapes keep
                # their ranks from the search, for rebuilding slow pipelines and the memory fallbacks
                candidates += [({**scores, **rescored}, rebalanced, speeds) for rescored, rebalanced, speeds
                               in self._merged_speeds(loads, merges, min_ways, samples, bins, shape)]
                tried += len(candidates) - 1
            bests.append(min((Finalist(scored[shape], layout_bins, shape, share, len(merges), scored, speeds)
                              for scored, layout_bins, speeds in candidates), key=lambda f: rank(f.score)))
        return bests, tried

    def _build(self, finalist: Finalist, samples: list[Sample], step: int, seed: Shape | None, tried: int,
               milp: MilpBudget | None) -> tuple[Plan, bool, float]:
        """The plan of a finalist: every pipeline built with its shape (memory fallbacks, slow
        pipelines reshaped), with its step; whether it fits, and its lead over whole samples."""
        _, bins, shape, share, num_merged, scores, merged_speeds = finalist
        ranked = sorted(scores, key=lambda c: (rank(scores[c]), c))
        pipelines, fallbacks, fitting = [], 0, True
        for bin_ in bins:
            pipe = self._best_pipeline(bin_, samples, shape, milp)
            if not self._fits(pipe):
                found = next((p for p in (self._memo_pipeline(bin_, samples, s) for s in self._fallbacks(shape, ranked))
                              if self._fits(p)), None)
                pipe, fitting = (pipe, False) if found is None else (found, fitting)
                fallbacks += 1
            pipelines.append(pipe)
        # the pipelines scored as they stand: the score (their sub-plan's step) bounds each one's
        scored = {(b.replicas, b.items) for b in self._scored_bins(bins, samples)}
        bounded = {i for i, (b, p) in enumerate(zip(bins, pipelines, strict=True))
                   if (b.replicas, b.items) in scored and self._pipeline(b, samples, shape) is p}
        scored_s = scores[shape][1]
        if any(pipelines[i] is not self._memo_pipeline(bins[i], samples, shape) for i in bounded):
            scored_s = self._simulate(pipelines[i] for i in sorted(bounded))[1]  # a merged one runs fewer groups than scored
        pipelines, reshaped, times = self._reshape_slow(bins, pipelines, samples, ranked, scored_s, bounded)
        # formations are reported in the plan only (scoring does not need them)
        pipelines = [dataclasses.replace(p, formations=formations(p.forward)) for p in pipelines]  # type: ignore[arg-type]
        info = {"candidate": "slimpack", "search": "full" if seed is None else "seeded",
                "num_groups": shape.num_groups, "backward": shape.backward,
                "slicing": shape.slicing, "lookahead": shape.lookahead, "head_weight": shape.head_weight,
                "merge_share": share, "merged_pipelines": num_merged,
                "merged_speeds": {str(k): v for k, v in sorted(merged_speeds.items())},
                "candidates": tried,
                "memory_fallback_pipelines": fallbacks, "reshaped_pipelines": reshaped,
                "milp": _milp_summary(milp.results if milp else None)}
        whole = [scores[c][1] for c in scores if not c.slicing and scores[c][0]]
        lead = scores[shape][1] / min(whole) if whole and scores[shape][0] else 1.0
        info["step_over_whole_samples"] = lead
        plan = Plan(config=self.config, strategy=self.name, step=step, samples=tuple(samples),
                    pipelines=tuple(pipelines), info=info)
        # a plan's step is the slowest of its pipelines' steps alone (the gradient all-reduce and
        # optimizer of a stage wait for every pipeline): with every scored pipeline kept, the
        # score and the times of the others give it without simulating the plan again
        step_s = max([scored_s, *times]) if len(bounded) == len(scored) else step_time(plan, self.cost)
        plan = dataclasses.replace(plan, info={**info, "step_s": step_s})
        return plan, fitting, lead

    def _merged_across_nodes(self, plan: Plan) -> bool:
        """Whether a merged pipeline of ``plan`` runs its context-parallel ring across nodes on
        some stage while one of a node's replicas would not: the merged groups phase 1 chose did
        not fit the nodes (wlbllm 64K, llama2-7b tp2 dp32: eleven groups of 2-3 replicas for eight
        nodes of four), and the batch on replicas merged k at a time, aligned to the nodes, may
        be faster."""
        return self._replicas_per_node > 1 and any(
            1 < len(pipe.replicas) <= self._replicas_per_node
            and any(self.cost.cp_crosses_nodes(pipe.replicas, stage) for stage in range(self.config.parallel.pp))
            for pipe in plan.pipelines)

    def _on_merged_replicas(self, plan: Plan | None, batch: Sequence[Sample], step: int, *,
                            full_search: bool) -> Plan | None:
        """``plan`` (None: none fits), or the batch planned on merged replicas (``merged``) where
        that simulates faster. Tried where nothing fits, and where memory is tight (the fullest
        device of ``plan`` above ``TIGHT_MEMORY`` of usable memory, or a merged pipeline crosses
        nodes it need not: ``_merged_across_nodes``) on the steps that run the full
        search (for batches up to ``CANDIDATES_MAX_SAMPLES``, as the baseline candidates), on the
        steps after one where merged replicas won, and whenever memory holds a pipeline below
        1F1B's warm-up (``merged.throttled``): a plan per width tried would double a seeded step's
        planning time, and consecutive batches are alike. A full-search step tries every width:
        the step is not monotonic in the width (wide probe 107, cell 55: 2, 4, 8 and 16 merged
        replicas step 117.7, 123.4, 111.5 and 134.0 s against 116.2 s on their own), and wider
        groups cross nodes or hold more. A seeded step tries the width that last won first, then
        the others narrowest first, stopping at the first that fits and is not faster than the best
        so far."""
        if not self._merge_whole_batch:
            return plan
        if plan is not None:
            across = self._merged_across_nodes(plan)
            worth_a_plan = ((full_search and len(batch) <= CANDIDATES_MAX_SAMPLES) or self._merge_width is not None
                            or throttled(plan) or across)
            if not worth_a_plan:  # decided before the peaks are computed: a pass over every pipeline's order
                return plan
            usable = self.config.cluster.usable_memory_bytes
            if not across and max(plan_peaks(plan, self.cost), default=0.0) <= TIGHT_MEMORY * usable:
                return plan
        # every plan the planner returns carries its simulated step (``safest_plan``), and a plan
        # of the widened layout takes the same time on the merged replicas (tests/strategies/test_wide_merge.py)
        best, best_s = plan, plan.info["step_s"] if plan is not None else float("inf")
        widths = merge_widths(self.config.parallel.dp)
        if not full_search and self._merge_width in widths:
            widths.remove(self._merge_width)
            widths.insert(0, self._merge_width)
        self._merge_width = None
        for k in widths:
            try:
                merged = on_merged_replicas(self._merged_planner(k).plan(batch, step=step), self.config, k)
            except UserError:
                continue  # nothing fits at this width either; a wider one may
            merged_s = merged.info["step_s"]
            if merged_s >= best_s:
                if full_search:
                    continue
                break
            name = merged.info.get("candidate", self.name)
            best, best_s = dataclasses.replace(merged, info={
                **merged.info, "candidate": f"{name} on {k} merged replicas", "merged_replicas": k,
                "single_replicas": dict(plan.info) if plan is not None else None}), merged_s
            self._merge_width = k
        return best


def _milp_summary(results: list[MilpResult] | None) -> dict | None:
    """How the MILP refinement went over all pipelines (None when it is switched off)."""
    if results is None:
        return None
    statuses = [r.status for r in results]
    before = sum(r.before for r in results)
    after = sum(r.after for r in results)
    return {status: statuses.count(status) for status in sorted(set(statuses))} | {
        "overload_before_s": before, "overload_after_s": after}
