"""A data loader that plans ahead: while step t trains, step t+1's batch is drawn and planned on a
background thread, so the planner's time is hidden behind training (DESIGN.md §1: "planning runs
ahead of training, so it costs the GPUs nothing").

Every rank runs its own loader and computes the same plan: the batch is a pure function of
(dataset, config, step) and the planners are deterministic given their inputs **with the MILP off**
(its result depends on how far the solver gets within a wall-clock limit, which differs between
ranks). So the loader forces ``use_milp=False``. The alternative, planning on rank 0 and
broadcasting the plan, would keep the MILP but put a collective (and rank 0's planner time) on the
critical path of every step; identical independent planning needs no communication at all.

Resumable at once: ``state_dict()`` is the step stream's state (the next step, the samples the
strategy holds back, and a stateful planner's own state, e.g. WLB's queues); ``load_state_dict``
restores it without replaying any earlier step (``strategies.stream``). The resumed loader yields the
same batches and byte-identical plans as one that never stopped (tested).
Must not import torch (it only plans); the training loop turns samples into tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from slimpack.config import Config
from slimpack.data import Dataset
from slimpack.strategies.stream import PlannedStep, PlanStream


class PlanningLoader:
    """Yields ``PlannedStep`` for steps ``0, 1, …`` (or from a restored state); with ``ahead`` the
    next step is planned on a background thread while the caller runs the current one."""

    def __init__(self, dataset: Dataset, config: Config, strategy: str, *, shuffle: bool = False,
                 ahead: bool = True) -> None:
        self.config = dataclasses.replace(config, planner=dataclasses.replace(config.planner, use_milp=False))
        self.strategy = strategy
        self.ahead = ahead
        self._stream = PlanStream(dataset, self.config, strategy, shuffle=shuffle)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slimpack-planner") if ahead else None
        self._pending: Future[tuple[PlannedStep, dict[str, Any]]] | None = None
        self._resume = self._stream.state_dict()
        """The stream's state just after the last step handed out (what a checkpoint saves)."""

    # ---- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: the stream's state after the last step it yielded."""
        return self._resume

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._drop_pending()
        self._stream.load_state_dict(state)
        self._resume = self._stream.state_dict()

    # ---- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[PlannedStep]:
        return self

    def __next__(self) -> PlannedStep:
        if self._pending is not None:
            item, self._resume = self._pending.result()
            self._pending = None
        else:
            item, self._resume = self._plan()
        if self._pool is not None:
            self._pending = self._pool.submit(self._plan)
        return item

    def close(self) -> None:
        self._drop_pending()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _drop_pending(self) -> None:
        """Wait for a step planned ahead and forget it (the stream is then one step further)."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def _plan(self) -> tuple[PlannedStep, dict[str, Any]]:
        """Plan the stream's next step and note its state after it (one thread at a time)."""
        item = next(self._stream)
        return item, self._stream.state_dict()
