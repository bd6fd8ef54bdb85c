"""Per-group overhead: the same tokens run unsliced and cut into slices, timed through the executor.

One sample of ``tokens`` tokens is cut into ``slices`` equal slices, each its own forward group and
its own backward group (backward in reverse slice order, as slicing needs), and run forward and
backward on one stage holding the whole model. Every slice after the first attends to the K/V
prefix of the earlier ones, so the attention FLOPs are the same as unsliced; what slicing adds is
per-group work: one more pass over the layers in Python, one more attention call per layer, more
autograd graphs. ``slice_throughput`` reports sliced tokens/s over unsliced tokens/s for the same
tokens (1.0 = no overhead).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slimpack.plan.types import PipelinePlan, Slice
from slimpack.runtime.model import Transformer
from slimpack.runtime.pipeline import build_executors, default_actions, run_in_order


def sliced_pipeline(tokens: int, slices: int) -> PipelinePlan:
    """Sample 0 of ``tokens`` tokens in ``slices`` near-equal slices, one per group."""
    if not 1 <= slices <= tokens:
        raise ValueError(f"cannot cut {tokens} tokens into {slices} slices")
    bounds = [tokens * i // slices for i in range(slices + 1)]
    cut = [Slice(0, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    return PipelinePlan(replicas=(0,), cp=1, forward=tuple((s,) for s in cut),
                        backward=tuple((s,) for s in reversed(cut)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(model: Transformer, tokens: torch.Tensor, slices: int, *, backend: str, repeats: int) -> float:
    """Seconds of one forward + backward of ``tokens`` (one sample) cut into ``slices``: the best of
    ``repeats`` runs after a warm-up. On the CPU this is the process's CPU time, not wall time: on a
    shared machine wall time mostly measures the other processes (run with one torch thread)."""
    pipe = sliced_pipeline(len(tokens), slices)
    actions = default_actions(pipe)
    device = next(model.parameters()).device
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    times = []
    for _ in range(repeats + 1):  # the first run warms up allocator and kernels
        executors = build_executors(model, pipe, num_chunks=1, sample_lengths={0: len(tokens)},
                                    tokens={0: tokens}, num_loss_tokens=len(tokens) - 1, backend=backend)
        _sync(device)
        began = clock()
        run_in_order(executors, actions)
        _sync(device)
        times.append(clock() - began)
    model.zero_grad(set_to_none=True)
    return min(times[1:])


@dataclass(frozen=True, slots=True)
class SliceTiming:
    slices: int
    seconds: float
    tokens_per_s: float
    relative: float
    """Throughput relative to unsliced (1 slice)."""
    per_group_layer_ms: float
    """Extra milliseconds per extra group per layer over unsliced (0 for 1 slice)."""
    alone_s: float
    """``slices`` times the seconds of one slice-sized sample run alone: the cost of running groups that
    small at all, without any prefix (what slicing adds is ``seconds`` minus this)."""


def slice_throughput(model: Transformer, num_tokens: int, counts: Sequence[int], *, backend: str,
                     repeats: int = 5, seed: int = 0) -> list[SliceTiming]:
    """Time ``num_tokens`` tokens unsliced and in each of ``counts`` slices (1 is always included)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=generator).to(device)
    layers = model.config.num_layers
    counts = sorted({1, *counts})
    seconds = {n: time_step(model, tokens, n, backend=backend, repeats=repeats) for n in counts}
    alone = {n: n * time_step(model, tokens[:num_tokens // n], 1, backend=backend, repeats=repeats) for n in counts}
    base = seconds[1]
    return [SliceTiming(n, s, num_tokens / s, base / s, 0.0 if n == 1 else (s - base) / (n - 1) / layers * 1e3,
                        alone[n])
            for n, s in seconds.items()]
