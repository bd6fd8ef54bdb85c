"""Run several strategies over the same consecutive steps and collect what users compare.

The protocol (DESIGN.md §3, "Comparison protocol"): every strategy sees the same batches of one
data stream (same dataset, sampler and seed), fed by one ``PlanStream`` per strategy. The first
``warmup_steps`` steps fill the strategies' state (WLB-LLM's outlier queues) and are not measured;
the next ``steps`` steps are the measured window. Work a strategy defers is carried across the
window's edges, never drained into it: the window's figures are a steady state. After the window,
a deferring strategy is drained (steps with no new samples) and the drain is reported on its own.
Stateless strategies skip the warm-up: their plans of the window's steps do not depend on it.

A strategy that fails on a step is recorded as failed for that step; the others go on.
Must not import torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from slimpack.collector import collector_paused
from slimpack.compare.row import StrategyRow, percentile
from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.data import ContextCut, SamplerConfig, context_cut
from slimpack.data import Dataset as LengthDataset
from slimpack.errors import UserError
from slimpack.plan.types import Plan
from slimpack.sim import SimResult, simulate
from slimpack.sim.idle import IdleSplit, idle_split
from slimpack.strategies import STRATEGIES
from slimpack.strategies.stream import PlannedStep, PlanStream

BASELINE = "fixed"
MAX_DRAIN_STEPS = 8
DEFAULT_WARMUP_STEPS = 2
DEFAULT_WINDOW_STEPS = 8

Phase = Literal["warmup", "window", "drain"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Window:
    """Which steps are measured: ``warmup_steps`` unmeasured steps, then ``steps`` measured ones."""

    warmup_steps: int = DEFAULT_WARMUP_STEPS
    steps: int = DEFAULT_WINDOW_STEPS

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise UserError(f"--warmup must be >= 0, got {self.warmup_steps}")
        if self.steps < 1:
            raise UserError(f"--steps (the measured window) must be >= 1, got {self.steps}")

    @property
    def first_step(self) -> int:
        return self.warmup_steps

    @property
    def end_step(self) -> int:
        """One past the window's last step."""
        return self.warmup_steps + self.steps

    def to_dict(self) -> dict[str, int]:
        return {"warmup_steps": self.warmup_steps, "steps": self.steps, "first_step": self.first_step,
                "last_step": self.end_step - 1}

    def describe(self) -> str:
        return (f"steps {self.first_step}–{self.end_step - 1} measured after {self.warmup_steps} warm-up "
                f"step{'s' if self.warmup_steps != 1 else ''}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    step: int
    phase: Phase
    error: str | None
    """Why the strategy failed on this step (None when it planned and simulated)."""
    planner_time_s: float
    result: SimResult | None
    scheduled_tokens: int
    """Tokens trained in this step (deferred ones excluded, earlier deferrals included)."""
    delayed_token_steps: int
    """Σ tokens × steps waited, over the samples this step trains."""
    held_tokens: int
    """Tokens the strategy holds back for later steps after this one."""
    pieces_cut_off: int = 0
    """Pieces the plan cut off documents at sequence boundaries (``PlannedStep.pieces_cut_off``)."""
    idle: IdleSplit | None = None
    """Where the step's idle device time went (fractions of device time, ``sim.idle``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyRun:
    name: str
    steps: tuple[StepRecord, ...]
    """Every step that ran: warm-up (stateful strategies only), window, drain."""
    plans: tuple[Plan | None, ...]

    def in_phase(self, phase: Phase) -> list[StepRecord]:
        return [s for s in self.steps if s.phase == phase]

    @property
    def ok_steps(self) -> list[StepRecord]:
        """The window's steps that planned and simulated (what every figure is computed over)."""
        return [s for s in self.in_phase("window") if s.result is not None]

    def representative(self) -> StepRecord | None:
        """The window step whose time is the median of the window (for charts)."""
        ok = sorted(self.ok_steps, key=lambda s: (s.result.step_time_s, s.step))  # type: ignore[union-attr]
        return ok[(len(ok) - 1) // 2] if ok else None

    def metrics(self, baseline_tokens_per_s: float | None = None) -> StrategyRow:
        """The figures of the comparison table, the report and the JSON, over the window."""
        ok = self.ok_steps
        results: list[SimResult] = [s.result for s in ok]  # type: ignore[misc]
        times = [r.step_time_s for r in results]
        tokens = sum(s.scheduled_tokens for s in ok)
        window = self.in_phase("window")
        drain = [s for s in self.in_phase("drain") if s.result is not None]

        def mean(values: Sequence[float]) -> float | None:
            return statistics.fmean(values) if values else None

        tokens_per_s = tokens / sum(times) if times else 0.0
        return StrategyRow(
            strategy=self.name,
            steps=len(window),
            failed_steps=tuple(s.step for s in self.steps if s.result is None),
            errors=tuple(sorted({s.error for s in self.steps if s.error})),
            tokens_per_s=tokens_per_s,
            window_tokens=tokens,
            window_time_s=sum(times),
            speedup_vs_fixed=tokens_per_s / baseline_tokens_per_s if baseline_tokens_per_s else None,
            step_time_mean_s=mean(times),
            step_time_p95_s=percentile(times, 95) if times else None,
            ideal_time_mean_s=mean([r.ideal_time_s for r in results]),
            # ratios of sums over the window: the ideal is the same for every strategy on the same tokens
            efficiency=_ratio(sum(r.ideal_time_s for r in results), sum(times)) if results else None,
            extra_work_fraction=(_ratio(sum(r.work_time_s for r in results), sum(r.ideal_time_s for r in results))
                                 - 1.0) if results else None,
            schedule_efficiency=_ratio(sum(r.work_time_s for r in results), sum(times)) if results else None,
            idle=_idle(ok),
            bubble_fraction=mean([r.bubble_fraction for r in results]),
            mfu=mean([r.mfu for r in results]),
            peak_memory_bytes=max((max(r.peak_memory_bytes) for r in results), default=0.0),
            memory_capacity_bytes=results[0].memory_capacity_bytes if results else None,
            # every step that ran, the drain's included: deferring work to a drain that does not
            # fit is not running the data (WLB holding an outlier that no step can hold)
            oom_steps=tuple(s.step for s in self.steps if s.result is not None and s.result.oom),
            planner_time_p50_s=statistics.median(s.planner_time_s for s in ok) if ok else None,
            mean_delay_steps_per_token=sum(s.delayed_token_steps for s in ok) / tokens if tokens else 0.0,
            held_after_window_tokens=window[-1].held_tokens if window else 0,
            pieces_cut_off=sum(s.pieces_cut_off for s in ok),
            drain_steps=len(self.in_phase("drain")),
            drain_time_s=sum(s.result.step_time_s for s in drain),  # type: ignore[union-attr]
            drain_tokens=sum(s.scheduled_tokens for s in drain),
            held_after_drain_tokens=self.steps[-1].held_tokens if self.steps else 0,
        )


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    config: Config
    dataset: str
    window: Window
    runs: tuple[StrategyRun, ...]
    context_cut: ContextCut
    """What the context length did to the dataset's documents (the same for every strategy)."""

    def table(self) -> list[StrategyRow]:
        """One row per strategy, in the order asked; speed-ups are over ``fixed`` when it ran."""
        base = next((run.metrics() for run in self.runs if run.name == BASELINE), None)
        return [run.metrics(base.tokens_per_s if base else None) for run in self.runs]


def check_strategies(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise UserError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                        f"valid: {', '.join(STRATEGIES)}")
    if not names:
        raise UserError("--strategies is empty")


PlanScreen = Callable[[Plan], str | None]
"""A test a plan must pass before it is simulated: the reason it fails, or None."""


def _record(stream: PlanStream, make_step: Callable[[], PlannedStep], phase: Phase,
            screen: PlanScreen | None = None, *, idle: bool = True) -> tuple[StepRecord, Plan | None]:
    """Plan (``make_step``) and simulate the stream's next step; a failure (or a plan ``screen``
    rejects, then not simulated) is recorded, not raised. ``idle``: split the step's idle time."""
    step = stream.step

    def failed(error: str) -> tuple[StepRecord, None]:
        return StepRecord(step=step, phase=phase, error=error, planner_time_s=0.0, result=None, scheduled_tokens=0,
                          delayed_token_steps=0, held_tokens=stream.held_tokens), None

    try:
        with collector_paused():  # every strategy's planning and simulation alike
            planned = make_step()
            rejected = screen(planned.plan) if screen is not None else None
            if rejected is not None:
                return failed(rejected)
            result = simulate(planned.plan, document_lengths=planned.trained_document_lengths)
    except Exception as exc:  # a strategy's failure on one step must not stop the comparison
        return failed(f"{type(exc).__name__}: {exc}")
    replicas = {p: len(pipe.replicas) for p, pipe in enumerate(planned.plan.pipelines)}
    return StepRecord(step=step, phase=phase, error=None, planner_time_s=planned.planner_time_s, result=result,
                      scheduled_tokens=planned.trained_tokens, delayed_token_steps=planned.delayed_token_steps,
                      held_tokens=stream.held_tokens, pieces_cut_off=planned.pieces_cut_off,
                      idle=idle_split(result, replicas) if idle else None), planned.plan


def run_strategy(name: str, config: Config, dataset: LengthDataset, window: Window, *, shuffle: bool = False,
                 on_step: Callable[[], None] = lambda: None, screen: PlanScreen | None = None,
                 stop_at_first_failure: bool = False, idle: bool = True) -> StrategyRun:
    """``name`` over ``window`` (warm-up only when the strategy is stateful), then its drain.
    ``screen`` fails, unsimulated, the steps whose plans it rejects (``tune`` rejects plans out of
    memory that way: the simulator would find them so at many times the cost).
    ``stop_at_first_failure``: end the run at its first step that failed or ran out of memory
    (``tune`` disqualifies such a run whatever its other steps do). ``idle``: split each step's
    idle time (``sim.idle``; ``tune`` reads none of it)."""
    try:
        stream = PlanStream(dataset, config, name, shuffle=shuffle, start=0)
    except UserError as exc:  # this strategy cannot run this setting: every step fails, others go on
        records = tuple(StepRecord(step=step, phase="window", error=str(exc), planner_time_s=0.0, result=None,
                                   scheduled_tokens=0, delayed_token_steps=0, held_tokens=0)
                        for step in range(window.first_step, window.end_step))
        for _ in range(window.end_step):
            on_step()
        return StrategyRun(name=name, steps=records, plans=(None,) * len(records))
    if not stream.stateful:
        stream.seek(window.first_step)
        for _ in range(window.first_step):
            on_step()
    records: list[StepRecord] = []
    plans: list[Plan | None] = []

    def stop() -> bool:
        """With ``stop_at_first_failure``: whether the last step failed or ran out of memory."""
        last = records[-1].result
        return stop_at_first_failure and (last is None or last.oom)

    while stream.step < window.end_step:
        phase: Phase = "warmup" if stream.step < window.first_step else "window"
        record, plan = _record(stream, lambda: next(stream), phase, screen, idle=idle)
        records.append(record)
        plans.append(plan)
        on_step()
        if stop():
            break
    else:  # the window ran to its end: then the drain
        for _ in range(MAX_DRAIN_STEPS):
            if not stream.held_tokens:
                break
            record, plan = _record(stream, stream.drain, "drain", screen, idle=idle)
            records.append(record)
            plans.append(plan)
            if stop():
                break
    return StrategyRun(name=name, steps=tuple(records), plans=tuple(plans))


def compare(config: Config, dataset: LengthDataset, strategies: Sequence[str], window: Window, *,
            shuffle: bool = False, on_step: Callable[[], None] = lambda: None) -> Comparison:
    """Every strategy over the same ``window`` of ``dataset``'s stream (see the module docstring)."""
    check_strategies(strategies)
    CostModel(config).check_states_fit()
    SamplerConfig.from_train(config.train)  # a setting no batch can be drawn from fails here, once
    runs = tuple(run_strategy(name, config, dataset, window, shuffle=shuffle, on_step=on_step)
                 for name in strategies)
    return Comparison(config=config, dataset=dataset.name, window=window, runs=runs,
                      context_cut=context_cut(dataset.lengths, config.train.max_context))
