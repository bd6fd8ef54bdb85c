"""What a simulation returns: step metrics, the timeline of every action, memory per device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Span:
    """One interval on a device: a forward/backward action, or the end-of-step gradient sync and
    optimizer step (``kind`` ``F``/``B``/``sync``/``optim``); ``group`` is -1 for the latter."""

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
    """The plan's total compute (GPU-seconds of its actions) divided by the number of GPUs."""
    efficiency: float
    """ideal / step: 1.0 means perfect balance and no bubble, sync or communication exposed."""
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
    spans: tuple[Span, ...]
    memory: tuple[DeviceMemory, ...]

    def summary(self) -> dict[str, Any]:
        """The stable JSON keys of ``slimpack simulate --json``."""
        return {
            "strategy": self.strategy,
            "step": self.step,
            "step_time_s": self.step_time_s,
            "ideal_time_s": self.ideal_time_s,
            "efficiency": self.efficiency,
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
        }
