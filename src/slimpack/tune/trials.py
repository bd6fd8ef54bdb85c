"""One trial of ``tune``: a strategy on a layout over a window of steps, run in this process or in
a worker process (``Trials``), and what it found (``Trial``).

A trial screens (the search's one-step figure, plans out of memory rejected before simulating) or
confirms (the comparison protocol's warm-up and measured window, ``compare.run``).
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from slimpack.collector import collector_paused
from slimpack.compare.run import Window, run_strategy
from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.data import Dataset
from slimpack.plan.types import Plan
from slimpack.strategies.slimpack.candidates import plan_fits
from slimpack.tune.layouts import Layout

Phase = Literal["screen", "window"]
SIMULATED = "simulated"
SIMULATED_OOM = "simulated: exceeds GPU memory"
PLAN_OOM = "pruned: its plan exceeds GPU memory (found from the plan's groups and order, not simulated)"
MAX_DEFAULT_WORKERS = 8
"""The most worker processes ``tune`` starts unless told (``default_workers``). Each holds the dataset
and one layout's plans (about 0.3 GB at its peak on a 256-GPU search), and past 8 the search gains
little: replayed on a virtual clock, two 256-GPU searches ran only 1.2-1.3x faster on 16 workers
than on 8 (an estimate, ``benchmarks/tune_workers.py``; timed only on 2 cores: docs/tune.md, "Workers")."""
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """One layout of one strategy, simulated (``tokens_per_s`` set) or not (``status`` says why)."""

    layout: Layout
    status: str
    """``simulated``, or why the layout was pruned or failed."""
    phase: Phase = "screen"
    """``screen``: the search's steps; ``window``: the comparison protocol's measured window."""
    floor_s: float | None = None
    """The time floor of the screened steps (None when pruned by memory first)."""
    tokens_per_s: float = 0.0
    undrained_tokens_per_s: float = 0.0
    """A screen's tokens trained over the screened steps' time, without the drain of what a
    deferring strategy held at their end (its figure over a window does not count the drain)."""
    efficiency: float | None = None
    step_time_s: float | None = None
    peak_memory_bytes: float = 0.0
    wall_s: float = field(default=0.0, compare=False)
    """Planning + simulation seconds this trial took (not part of what it found)."""

    @property
    def ok(self) -> bool:
        return self.status == SIMULATED


@dataclass(frozen=True, slots=True)
class Task:
    strategy: str
    layout: Layout
    config: Config
    phase: Phase
    window: Window
    floor_s: float | None = None
    reject_oom: bool = False
    """Fail, unsimulated, a step whose plan exceeds GPU memory (``plan_out_of_memory``)."""


def reason(message: str) -> str:
    """A countable reason: the message's first clause with its numbers replaced by N."""
    if "optimizer states alone" in message:
        return "model states (parameters, gradients, optimizer) exceed GPU memory"
    return re.sub(r"(?<![A-Za-z])\d+(\.\d+)?(?![A-Za-z])", "N", message.split(";")[0])[:140]


def failure_status(strategy: str, message: str) -> str:
    """A failed trial's status: the reason under the strategy's name, since the summary adds up the
    strategies' statuses (a message that names its strategy itself is not named twice)."""
    return f"failed ({strategy}): {reason(message.removeprefix(f'{strategy}: '))}"


def plan_out_of_memory(plan: Plan) -> str | None:
    """``PLAN_OOM`` when a device of the plan would exceed GPU memory: a device runs its actions
    one after another, so its peak follows from its order alone (``stage_peak_bytes``, equal to
    the simulator's peak) without the timeline the simulator spends its time on."""
    return None if plan_fits(plan, CostModel(plan.config)) else PLAN_OOM


def run_trial(task: Task, dataset: Dataset) -> Trial:
    """The strategy over the task's window: screening uses throughput with the drain (the time
    floor bounds the whole batches' time, deferred work included); a window trial reports the
    steady window's throughput, as ``compare`` does."""
    began = time.perf_counter()
    screen = plan_out_of_memory if task.reject_oom else None
    config = task.config
    if task.phase == "screen":
        # SlimPack's whole batch on k merged replicas is the plan of the layout with k times the cp
        # and 1/k the replicas, which the search screens as a layout of its own
        config = dataclasses.replace(config, planner=dataclasses.replace(config.planner, use_wide_merge=False))
    # the collector stays off for the whole trial, not only inside each step's planning and
    # simulation (``collector_paused``): a trial keeps none of its plans, so reference counting
    # frees them as it ends, before the collector would walk them
    with collector_paused():
        row = run_strategy(task.strategy, config, dataset, task.window, screen=screen,
                           stop_at_first_failure=True, idle=False).metrics()
    common = {"layout": task.layout, "phase": task.phase, "floor_s": task.floor_s,
              "wall_s": time.perf_counter() - began}
    if PLAN_OOM in row.errors:
        return Trial(status=PLAN_OOM, **common)  # type: ignore[arg-type]
    if row.failed_steps:
        return Trial(status=failure_status(task.strategy, row.errors[0]), **common)  # type: ignore[arg-type]
    if row.oom_steps:
        return Trial(status=SIMULATED_OOM, peak_memory_bytes=row.peak_memory_bytes, **common)  # type: ignore[arg-type]
    tokens_per_s = row.tokens_per_s_with_drain if task.phase == "screen" else row.tokens_per_s
    return Trial(status=SIMULATED, tokens_per_s=tokens_per_s, undrained_tokens_per_s=row.tokens_per_s,  # type: ignore[arg-type]
                 efficiency=row.efficiency,
                 step_time_s=row.step_time_mean_s, peak_memory_bytes=row.peak_memory_bytes, **common)


def default_workers(cgroup_cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """One worker per CPU this process may run on, at most ``MAX_DEFAULT_WORKERS``: the CPUs its
    affinity allows, fewer where a cgroup (v2) CPU quota allows less (a container shows the host's
    cores but may be given two of them). Trials are the same for any number of workers."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpus(cgroup_cpu_max)
    return max(1, min(cpus, quota if quota is not None else cpus, MAX_DEFAULT_WORKERS))


def _cgroup_cpus(path: Path) -> int | None:
    """Whole CPUs a cgroup v2 ``cpu.max`` file ("quota period", or "max period") allows, at least
    one; None where there is no such file or it sets no quota."""
    try:
        quota, period = path.read_text().split()
        return None if quota == "max" else max(1, math.floor(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


_WORKER_DATASET: Dataset | None = None


def _init_worker(dataset: Dataset) -> None:
    global _WORKER_DATASET
    _WORKER_DATASET = dataset


def _run_in_worker(task: Task) -> Trial:
    assert _WORKER_DATASET is not None
    return run_trial(task, _WORKER_DATASET)


class Trials:
    """Runs trials: in this process (``workers`` = 1, each at once when submitted) or in a pool of
    worker processes that each hold the dataset."""

    def __init__(self, dataset: Dataset, workers: int) -> None:
        self.dataset = dataset
        self.workers = workers
        self._pool: Executor | None = (ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(dataset,))
                                       if workers > 1 else None)

    def submit(self, task: Task) -> Future[Trial]:
        if self._pool is not None:
            return self._pool.submit(_run_in_worker, task)
        done: Future[Trial] = Future()
        done.set_result(run_trial(task, self.dataset))
        return done

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
