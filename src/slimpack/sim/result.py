"""What a simulation returns: step metrics, the timeline of every action, memory per device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Span(NamedTuple):
    """One interval on a device: a forward/backward action, or the end-of-step gradient sync and
    optimizer step (``kind`` ``F``/``B``/``sync``/``optim``); ``group`` is -1 for the latter. A
    named tuple, so that the simulator makes a step's spans (one per action) in C."""

    pipeline: int
    stage: int
    kind: str
    group: int
    chunk: int
    start_s: float
    end_s: float
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMemory:
    pipeline: int
    stage: int
    model_state_bytes: float
    times_s: tuple[float, ...]
    """Instants at which the live bytes change (a step function)."""
    live_bytes: tuple[float, ...]
    """Bytes in use (model states + activations + working set) from each instant on."""

    @property
    def peak_bytes(self) -> float:
        return max(self.live_bytes, default=self.model_state_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    strategy: str
    step: int
    step_time_s: float
    ideal_time_s: float
    """Whole-document training work of the samples trained (unsliced, no overheads, at full kernel
    efficiency) divided by the number of GPUs: the same for every plan of the same samples."""
    work_time_s: float
    """The plan's own modelled work (GPU-seconds of its actions: slicing, per-call costs, TP/CP
    communication and recomputation included) divided by the number of GPUs."""
    efficiency: float
    """ideal / step, comparable across strategies on the same samples."""
    bubble_fraction: float
    """Idle share of the devices between the step's start and the end of the last backward."""
    num_tokens: int
    tokens_per_s: float
    mfu: float
    """Model FLOPs (no recomputation) per second over the GPUs' peak."""
    num_gpus: int
    peak_memory_bytes: tuple[float, ...]
    """Per pipeline stage, the maximum over pipelines."""
    memory_capacity_bytes: float
    oom: bool
    forward_group_times_s: tuple[tuple[float, ...], ...]
    """Per pipeline, each forward group's time on a middle stage (no embedding or LM head)."""
    backward_group_times_s: tuple[tuple[float, ...], ...]
    forward_group_cells: tuple[tuple[int, ...], ...]
    """Per pipeline, the cells each forward group runs as (1 per group in a symmetric plan)."""
    backward_group_cells: tuple[tuple[int, ...], ...]
    spans: tuple[Span, ...]
    memory: tuple[DeviceMemory, ...]

    @property
    def extra_work_fraction(self) -> float:
        """The plan's own extra work over the whole-document ideal (work / ideal - 1): slicing
        (short slices below peak, per-cell fixed costs), communication, recomputation."""
        return self.work_time_s / self.ideal_time_s - 1.0 if self.ideal_time_s > 0 else 0.0

    @property
    def schedule_efficiency(self) -> float:
        """work / step: how well the schedule packs the plan's own work (balance and bubbles only)."""
        return self.work_time_s / self.step_time_s if self.step_time_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The stable JSON keys of ``slimpack simulate --json``."""
        return {
            "strategy": self.strategy,
            "step": self.step,
            "step_time_s": self.step_time_s,
            "ideal_time_s": self.ideal_time_s,
            "work_time_s": self.work_time_s,
            "efficiency": self.efficiency,
            "extra_work_fraction": self.extra_work_fraction,
            "schedule_efficiency": self.schedule_efficiency,
            "bubble_fraction": self.bubble_fraction,
            "num_tokens": self.num_tokens,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "num_gpus": self.num_gpus,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "oom": self.oom,
            "forward_group_times_s": [list(p) for p in self.forward_group_times_s],
            "backward_group_times_s": [list(p) for p in self.backward_group_times_s],
            "forward_group_cells": [list(p) for p in self.forward_group_cells],
            "backward_group_cells": [list(p) for p in self.backward_group_cells],
        }
