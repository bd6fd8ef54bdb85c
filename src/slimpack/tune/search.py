"""``tune``: the best layout of each strategy on a GPU budget, by branch and bound over layouts.

For each strategy: every layout the budget allows (``layouts``) that passes the memory floor is
given its time floor (``bounds``); layouts are simulated in order of rising floor, and once a
layout's floor says it cannot beat the best simulated so far, it and all after it are pruned.
Because the floors are true lower bounds, the best found is the best exhaustive simulation would
find (``exhaustive=True`` simulates everything, for tests and checks).
Must not import torch.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from slimpack.compare.run import Window, check_strategies, run_strategy
from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.data import Dataset
from slimpack.errors import UserError
from slimpack.plan.types import Sample
from slimpack.strategies.stream import stream_batches
from slimpack.tune.bounds import memory_floor_bytes, time_floor_s
from slimpack.tune.layouts import Layout, layouts

PRUNED_BY_BOUND = "pruned: its time floor cannot beat the best simulated layout"
PRUNED_BY_MEMORY = "pruned: model states plus the longest sample's activations exceed GPU memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """One layout of one strategy, simulated (``tokens_per_s`` set) or not (``status`` says why)."""

    layout: Layout
    status: str
    """``simulated``, or why the layout was pruned or failed."""
    floor_s: float | None = None
    """The time floor of the run (None when pruned by memory first)."""
    tokens_per_s: float = 0.0
    efficiency: float | None = None
    step_time_s: float | None = None
    peak_memory_bytes: float = 0.0
    wall_s: float = 0.0
    """Planning + simulation seconds this trial took."""

    @property
    def ok(self) -> bool:
        return self.status == "simulated"


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyTuning:
    strategy: str
    trials: tuple[Trial, ...]
    """In the order they were considered (simulated ones in the order simulated)."""

    @property
    def best(self) -> Trial | None:
        ok = [t for t in self.trials if t.ok]
        return max(ok, key=lambda t: t.tokens_per_s) if ok else None

    def counts(self) -> Counter[str]:
        return Counter(t.status for t in self.trials)


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneResult:
    base: Config
    num_gpus: int
    dataset: str
    steps: int
    strategies: tuple[StrategyTuning, ...]
    skipped: Counter[str] = field(default_factory=Counter)
    """Layouts that cannot hold the model at all (every strategy), by reason."""
    wall_s: float = 0.0

    def best_config(self, strategy: str | None = None) -> Config | None:
        """The winning config overall, or ``strategy``'s best."""
        pool = [s for s in self.strategies if strategy in (None, s.strategy) and s.best is not None]
        if not pool:
            return None
        winner = max(pool, key=lambda s: s.best.tokens_per_s)  # type: ignore[union-attr]
        return winner.best.layout.apply(self.base)  # type: ignore[union-attr]


def candidate_layouts(base: Config, num_gpus: int, batches: Sequence[Sequence[Sample]]
                      ) -> tuple[list[tuple[Layout, Config]], Counter[str]]:
    """Every layout with a valid config and model states that fit, and the others' reasons."""
    skipped: Counter[str] = Counter()
    lengths = [s.length for s in batches[0]]
    out = []
    for layout in layouts(base, num_gpus, lengths, skipped):
        try:
            config = layout.apply(base)
            CostModel(config).check_states_fit()
        except UserError as exc:
            skipped[_reason(str(exc))] += 1
            continue
        out.append((layout, config))
    return out, skipped


def _reason(message: str) -> str:
    """A countable reason: the message's first clause with its numbers replaced by N."""
    if "optimizer states alone" in message:
        return "model states (parameters, gradients, optimizer) exceed GPU memory"
    return re.sub(r"(?<![A-Za-z])\d+(\.\d+)?(?![A-Za-z])", "N", message.split(";")[0])[:140]


def tune_strategy(strategy: str, candidates: Sequence[tuple[Layout, Config]],
                  batches: Sequence[Sequence[Sample]], dataset: Dataset, *, exhaustive: bool = False,
                  on_trial: Callable[[Trial], None] = lambda t: None) -> StrategyTuning:
    """Branch and bound over ``candidates`` for one strategy (see the module docstring)."""
    lengths = [[s.length for s in b] for b in batches]
    tokens = sum(map(sum, lengths))
    longest = max(max(b) for b in lengths if b)
    trials: list[Trial] = []
    ranked = []
    for layout, config in candidates:
        cost = CostModel(config)
        if memory_floor_bytes(cost, longest, strategy) > config.cluster.usable_memory_bytes:
            trials.append(Trial(layout=layout, status=PRUNED_BY_MEMORY))
            on_trial(trials[-1])
            continue
        ranked.append((time_floor_s(cost, lengths, strategy), layout.label(), layout, config))
    ranked.sort(key=lambda r: (r[0], r[1]))
    best = 0.0
    for floor, _, layout, config in ranked:
        if not exhaustive and tokens / floor <= best:
            trials.append(Trial(layout=layout, status=PRUNED_BY_BOUND, floor_s=floor))
        else:
            trials.append(_simulate(strategy, layout, config, dataset, len(batches), floor))
            if trials[-1].ok:
                best = max(best, trials[-1].tokens_per_s)
        on_trial(trials[-1])
    return StrategyTuning(strategy=strategy, trials=tuple(trials))


def _simulate(strategy: str, layout: Layout, config: Config, dataset: Dataset, steps: int, floor: float) -> Trial:
    """The strategy over steps ``0 .. steps - 1`` as the measured window (no warm-up; see compare.run)."""
    began = time.perf_counter()
    run = run_strategy(strategy, config, dataset, Window(warmup_steps=0, steps=steps))
    wall = time.perf_counter() - began
    row = run.metrics()
    if row.failed_steps:
        return Trial(layout=layout, status=f"failed: {_reason(row.errors[0])}", floor_s=floor, wall_s=wall)
    if row.oom_steps:
        return Trial(layout=layout, status="simulated: exceeds GPU memory", floor_s=floor, wall_s=wall,
                     peak_memory_bytes=row.peak_memory_bytes)
    # a deferring strategy's drain counts: the time floor bounds the whole batches' time
    return Trial(layout=layout, status="simulated", floor_s=floor, tokens_per_s=row.tokens_per_s_with_drain,
                 efficiency=row.efficiency, step_time_s=row.step_time_mean_s,
                 peak_memory_bytes=row.peak_memory_bytes, wall_s=wall)


def _in_workers(workers: int, strategies: Sequence[str], candidates: Sequence[tuple[Layout, Config]],
                batches: Sequence[Sequence[Sample]], dataset: Dataset, exhaustive: bool,
                on_trial: Callable[[str, Trial], None]) -> tuple[StrategyTuning, ...]:
    """One strategy per task; each search is sequential (its pruning needs its best so far)."""
    done: dict[str, StrategyTuning] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(tune_strategy, name, candidates, batches, dataset, exhaustive=exhaustive): name
                   for name in strategies}
        for future in as_completed(futures):
            tuning = future.result()
            done[tuning.strategy] = tuning
            for trial in tuning.trials:
                on_trial(tuning.strategy, trial)
    return tuple(done[name] for name in strategies)


def tune(base: Config, dataset: Dataset, num_gpus: int, strategies: Sequence[str], *, steps: int = 1,
         exhaustive: bool = False, workers: int = 1, on_candidates: Callable[[int], None] = lambda n: None,
         on_trial: Callable[[str, Trial], None] = lambda s, t: None) -> TuneResult:
    """The best layout of each strategy for ``num_gpus`` GPUs; ``base`` gives the model, cluster,
    context, batch and planner settings (its parallel layout and recomputation are searched).
    ``workers`` > 1 searches that many strategies at once in worker processes (``on_trial`` then
    hears of a strategy's trials when it is done)."""
    check_strategies(strategies)
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    began = time.perf_counter()
    batches = stream_batches(dataset, base, steps)
    candidates, skipped = candidate_layouts(base, num_gpus, batches)
    if not candidates:
        reasons = "; ".join(f"{n}x {r}" for r, n in skipped.most_common(3))
        raise UserError(f"no layout of {num_gpus} GPUs can hold {base.model.name} ({reasons})")
    on_candidates(len(candidates))
    if workers > 1 and len(strategies) > 1:
        results = _in_workers(workers, strategies, candidates, batches, dataset, exhaustive, on_trial)
    else:
        results = tuple(tune_strategy(name, candidates, batches, dataset, exhaustive=exhaustive,
                                      on_trial=lambda t, name=name: on_trial(name, t)) for name in strategies)
    return TuneResult(base=base, num_gpus=num_gpus, dataset=dataset.name, steps=steps, strategies=results,
                      skipped=skipped, wall_s=time.perf_counter() - began)
