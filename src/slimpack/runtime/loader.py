"""A data loader that plans ahead: while step t trains, step t+1's batch is drawn and planned on a
background thread, so the planner's time is hidden behind training (DESIGN.md §1: "planning runs
ahead of training, so it costs the GPUs nothing").

Every rank runs its own loader and computes the same plan: the batch is a pure function of
(dataset, config, step) and the planners are deterministic given their inputs **with the MILP off**
(its result depends on how far the solver gets within a wall-clock limit, which differs between
ranks). So the loader forces ``use_milp=False``. The alternative, planning on rank 0 and
broadcasting the plan, would keep the MILP but put a collective (and rank 0's planner time) on the
critical path of every step; identical independent planning needs no communication at all.

Resumable: ``state_dict()`` holds the next step and the next sample id; ``load_state_dict`` sets them
and replays the planner over the earlier steps (without running them), because some planners
carry state between steps (WLB's queue of delayed outliers). The resumed loader yields the same
batches and byte-identical plans as one that never stopped (tested).
Must not import torch (it only plans); the training loop turns samples into tensors.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from slimpack.config import Config
from slimpack.data import Dataset, GlobalBatchSampler, SamplerConfig
from slimpack.data import Sample as DataSample
from slimpack.plan.types import Plan
from slimpack.plan.types import Sample as PlanSample
from slimpack.strategies import make_planner

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class StepInput:
    step: int
    plan: Plan
    sources: dict[int, DataSample]
    """Plan sample id -> the sampler's sample (document index, chunk) it came from."""
    plan_time_s: float
    """Wall time the planner took for this step (on the background thread when planning ahead)."""


class PlanningLoader:
    """Yields ``StepInput`` for steps ``start, start+1, …``; with ``ahead`` the next step is planned
    on a background thread while the caller runs the current one."""

    def __init__(self, dataset: Dataset, config: Config, strategy: str, *, shuffle: bool = False,
                 ahead: bool = True) -> None:
        self.config = dataclasses.replace(config, planner=dataclasses.replace(config.planner, use_milp=False))
        self.strategy = strategy
        self.sampler = GlobalBatchSampler(dataset, SamplerConfig.from_train(config.train, shuffle=shuffle))
        self.ahead = ahead
        self._planner = make_planner(strategy, self.config)
        self._step = 0
        self._next_id = 0
        self._sources: dict[int, DataSample] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slimpack-planner") if ahead else None
        self._pending: Future[tuple[StepInput, int]] | None = None
        self._resume = (0, 0)  # (next step to hand out, sample id it starts at)

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: the next step to yield and the next sample id."""
        step, next_id = self._resume
        return {"version": STATE_VERSION, "strategy": self.strategy, "step": step, "next_id": next_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or state.get("strategy") != self.strategy:
            raise ValueError(f"loader state {state!r} is not a version-{STATE_VERSION} state for "
                             f"strategy {self.strategy!r}")
        self._drop_pending()
        self._planner = make_planner(self.strategy, self.config)
        self._step, self._next_id, self._sources = 0, 0, {}
        while self._step < state["step"]:  # replay: planners may carry samples between steps
            self._plan(self._step)
        if self._next_id != state["next_id"]:
            raise ValueError(f"loader state {state!r} does not match this dataset and config "
                             f"(replay reached sample id {self._next_id})")
        self._resume = (self._step, self._next_id)

    # ---- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[StepInput]:
        return self

    def __next__(self) -> StepInput:
        if self._pending is not None:
            item, next_id = self._pending.result()
            self._pending = None
        else:
            item, next_id = self._plan(self._step)
        self._resume = (item.step + 1, next_id)
        if self._pool is not None:
            self._pending = self._pool.submit(self._plan, self._step)
        return item

    def close(self) -> None:
        self._drop_pending()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _drop_pending(self) -> None:
        """Wait for a step planned ahead and forget it (``load_state_dict`` replays from scratch)."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _plan(self, step: int) -> tuple[StepInput, int]:
        """Draw and plan ``step``; advances the loader's position (runs on one thread at a time)."""
        assert step == self._step
        batch = self.sampler.batch_at(step)
        samples = [PlanSample(id=self._next_id + s.id, length=s.length, arrival_step=step) for s in batch.samples]
        for s in batch.samples:
            self._sources[self._next_id + s.id] = s
        began = time.perf_counter()
        plan = self._planner.plan(samples, step=step)
        elapsed = time.perf_counter() - began
        used = {s.sample_id for pipe in plan.pipelines for g in pipe.forward for s in g}
        sources = {sid: self._sources[sid] for sid in used}
        for sid in used:  # a sample runs once; deferred ones stay until their step
            del self._sources[sid]
        self._next_id += len(batch.samples)
        self._step += 1
        return StepInput(step=step, plan=plan, sources=sources, plan_time_s=elapsed), self._next_id
