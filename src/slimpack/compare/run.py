"""Run several strategies over the same consecutive steps and collect what users compare.

Every strategy sees the same batches (same dataset, sampler and seed). A planner is built once per
strategy and called step after step, so strategies that defer samples (WLB-LLM) carry them into
later steps and pay for it in delay. A strategy that fails on a step is recorded as failed for that
step; the others go on.
Must not import torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.data import Dataset as LengthDataset
from slimpack.data import GlobalBatchSampler, SamplerConfig
from slimpack.errors import UserError
from slimpack.plan.types import Plan, Sample
from slimpack.sim import SimResult, simulate
from slimpack.sim.idle import IdleSplit, idle_split
from slimpack.strategies import STRATEGIES, make_planner

BASELINE = "fixed"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    step: int
    error: str | None
    """Why the strategy failed on this step (None when it planned and simulated)."""
    planner_time_s: float
    result: SimResult | None
    scheduled_tokens: int
    """Tokens trained in this step (deferred ones excluded, earlier deferrals included)."""
    delayed_token_steps: int
    """Σ tokens × steps waited, over the samples this step trains."""
    drain: bool = False
    """An extra step with no new samples, run so a deferring strategy trains what it still holds
    (every strategy is then charged for the same tokens)."""
    idle: IdleSplit | None = None
    """Where the step's idle device time went (fractions of device time, ``sim.idle``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyRun:
    name: str
    steps: tuple[StepRecord, ...]
    plans: tuple[Plan | None, ...]

    @property
    def ok_steps(self) -> list[StepRecord]:
        return [s for s in self.steps if s.result is not None]

    def representative(self) -> StepRecord | None:
        """The step whose time is the median of this strategy's steps (for charts)."""
        ok = sorted(self.ok_steps, key=lambda s: (s.result.step_time_s, s.step))  # type: ignore[union-attr]
        return ok[(len(ok) - 1) // 2] if ok else None

    def metrics(self) -> dict[str, Any]:
        """The per-strategy figures of the comparison table and JSON (keys documented in
        docs/compare.md; ``speedup_vs_fixed`` is added by ``Comparison``)."""
        ok = self.ok_steps
        results = [s.result for s in ok]
        times = [r.step_time_s for r in results]  # type: ignore[union-attr]
        tokens = sum(s.scheduled_tokens for s in ok)
        peak = max((max(r.peak_memory_bytes) for r in results), default=0.0)  # type: ignore[union-attr]
        return {
            "strategy": self.name,
            "steps": sum(1 for s in self.steps if not s.drain),
            "drain_steps": sum(1 for s in self.steps if s.drain),
            "failed_steps": [s.step for s in self.steps if s.result is None],
            "errors": sorted({s.error for s in self.steps if s.error}),
            "tokens_per_s": tokens / sum(times) if times else 0.0,
            "step_time_mean_s": statistics.fmean(times) if times else None,
            "step_time_p95_s": _percentile(times, 95) if times else None,
            "ideal_time_mean_s": statistics.fmean(r.ideal_time_s for r in results) if results else None,
            # ratios of sums over the steps: the ideal is the same for every strategy on the same tokens
            "efficiency": _ratio(sum(r.ideal_time_s for r in results), sum(times)) if results else None,
            "extra_work_fraction": (_ratio(sum(r.work_time_s for r in results), sum(r.ideal_time_s for r in results))
                                    - 1.0) if results else None,
            "schedule_efficiency": _ratio(sum(r.work_time_s for r in results), sum(times)) if results else None,
            "idle": _idle(ok),
            "bubble_fraction": statistics.fmean(r.bubble_fraction for r in results) if results else None,
            "mfu": statistics.fmean(r.mfu for r in results) if results else None,
            "peak_memory_bytes": peak,
            "memory_capacity_bytes": results[0].memory_capacity_bytes if results else None,  # type: ignore[union-attr]
            "oom_steps": [s.step for s in ok if s.result.oom],  # type: ignore[union-attr]
            "planner_time_p50_s": statistics.median(s.planner_time_s for s in ok) if ok else None,
            "mean_delay_steps_per_token": (sum(s.delayed_token_steps for s in ok) / tokens) if tokens else 0.0,
            "deferred_at_end_tokens": _deferred_at_end(self),
        }


def _idle(steps: Sequence[StepRecord]) -> dict[str, float] | None:
    """The steps' idle splits weighted by step time (fractions of all the steps' device time)."""
    weighted = [(s.idle, s.result.step_time_s) for s in steps if s.idle is not None and s.result is not None]
    total = sum(weight for _, weight in weighted)
    if not total:
        return None
    keys = weighted[0][0].to_dict()
    return {key: sum(idle.to_dict()[key] * weight for idle, weight in weighted) / total for key in keys}


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def _deferred_at_end(run: StrategyRun) -> int:
    last = run.plans[-1] if run.plans else None
    if last is None:
        return 0
    lengths = last.sample_lengths()
    return sum(lengths[i] for i in last.deferred)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    config: Config
    dataset: str
    runs: tuple[StrategyRun, ...]

    def table(self) -> list[dict[str, Any]]:
        rows = [run.metrics() for run in self.runs]
        base = next((r["tokens_per_s"] for r in rows if r["strategy"] == BASELINE), None)
        for row in rows:
            row["speedup_vs_fixed"] = row["tokens_per_s"] / base if base else None
        return rows


def step_batches(dataset: LengthDataset, config: Config, num_steps: int, *, shuffle: bool = False
                 ) -> list[list[Sample]]:
    """The batches of steps 0..num_steps-1 as plan samples with ids unique across the run."""
    sampler = GlobalBatchSampler(dataset, SamplerConfig.from_train(config.train, shuffle=shuffle))
    batches, next_id = [], 0
    for step in range(num_steps):
        batch = sampler.batch_at(step)
        batches.append([Sample(id=next_id + s.id, length=s.length, arrival_step=step) for s in batch.samples])
        next_id += len(batch.samples)
    return batches


def check_strategies(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise UserError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                        f"valid: {', '.join(STRATEGIES)}")
    if not names:
        raise UserError("--strategies is empty")


MAX_DRAIN_STEPS = 8


def trained_documents(plan: Plan, batch: Sequence[Sample]) -> list[int]:
    """Lengths of the whole documents ``plan`` trains: this step's batch and the samples carried in
    from earlier steps, less those deferred. A strategy may cut a document into several samples
    (``fixed``); the ideal step time and MFU are of the documents, the same for every strategy."""
    deferred = set(plan.deferred)
    carried = [s.length for s in plan.samples if s.arrival_step < plan.step and s.id not in deferred]
    return carried + [s.length for s in batch if s.id not in deferred]


def run_strategy(name: str, config: Config, batches: Sequence[Sequence[Sample]],
                 on_step: Callable[[], None] = lambda: None) -> StrategyRun:
    try:
        planner = make_planner(name, config)
    except UserError as exc:  # this strategy cannot run this setting: every step fails, others go on
        records = tuple(StepRecord(step=step, error=str(exc), planner_time_s=0.0, result=None,
                                   scheduled_tokens=0, delayed_token_steps=0) for step in range(len(batches)))
        for _ in batches:
            on_step()
        return StrategyRun(name=name, steps=records, plans=(None,) * len(batches))
    records: list[StepRecord] = []
    plans: list[Plan | None] = []
    steps = [list(b) for b in batches]
    step = 0
    while step < len(steps):
        batch = steps[step]
        began = time.perf_counter()
        try:
            plan = planner.plan(batch, step=step)
            planner_time = time.perf_counter() - began
            result = simulate(plan, document_lengths=trained_documents(plan, batch))
        except Exception as exc:  # a strategy's failure on one step must not stop the comparison
            records.append(StepRecord(step=step, error=f"{type(exc).__name__}: {exc}", planner_time_s=0.0,
                                      result=None, scheduled_tokens=0, delayed_token_steps=0,
                                      drain=step >= len(batches)))
            plans.append(None)
            on_step()
            step += 1
            continue
        deferred = set(plan.deferred)
        trained = [s for s in plan.samples if s.id not in deferred]
        records.append(StepRecord(
            step=step, error=None, planner_time_s=planner_time, result=result,
            idle=idle_split(result, {p: len(pipe.replicas) for p, pipe in enumerate(plan.pipelines)}),
            scheduled_tokens=sum(s.length for s in trained),
            delayed_token_steps=sum(s.length * (step - s.arrival_step) for s in trained),
            drain=step >= len(batches)))
        plans.append(plan)
        if step < len(batches):
            on_step()
        if step == len(steps) - 1 and plan.deferred and len(steps) < len(batches) + MAX_DRAIN_STEPS:
            steps.append([])
        step += 1
    return StrategyRun(name=name, steps=tuple(records), plans=tuple(plans))


def compare(config: Config, dataset: LengthDataset, strategies: Sequence[str], num_steps: int, *,
            shuffle: bool = False, on_step: Callable[[], None] = lambda: None) -> Comparison:
    check_strategies(strategies)
    CostModel(config).check_states_fit()
    if num_steps < 1:
        raise UserError(f"--steps must be >= 1, got {num_steps}")
    batches = step_batches(dataset, config, num_steps, shuffle=shuffle)
    runs = tuple(run_strategy(name, config, batches, on_step) for name in strategies)
    return Comparison(config=config, dataset=dataset.name, runs=runs)
