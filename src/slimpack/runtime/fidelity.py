"""Run a plan for real and compare with the simulator's prediction (``slimpack fidelity``).

``measure_rank`` runs on every rank (spawned by ``runtime.launch``): one warm-up step, ``repeats``
timed steps (no optimizer step, so every repeat does the same work), then one more step with the
``ActivationTracker`` on (hooks cost time, so memory is never measured in a timed step). A step's
measured time is the end of the last rank's optimizer span, from the step barrier; the figure is
the fastest repeat. ``predicted_activation_peaks`` gives the simulator's per-stage peak of
bytes kept for backward (what ``ActivationTracker`` counts: no model states, no working set).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from slimpack.cost import CostModel
from slimpack.plan.types import Plan
from slimpack.sim.result import SimResult


def measure_rank(rank: int, world_size: int, plan: Plan, repeats: int, threads: int) -> dict[str, Any]:
    from slimpack.runtime.distributed import RankRuntime
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.model import build_model
    from slimpack.runtime.verify import plan_lengths, random_tokens

    torch.set_num_threads(threads)
    dtype = {4: torch.float32, 8: torch.float64, 2: torch.bfloat16}[plan.config.model.dtype_bytes]
    model = build_model(plan.config.model, seed=0, dtype=dtype)
    runtime = RankRuntime(model, Mesh.from_parallel(plan.config.parallel),
                          virtual_stages=plan.config.parallel.virtual_stages,
                          stage_layers=plan.config.parallel.stage_layers)
    tokens = random_tokens(plan_lengths(plan), plan.config.model.vocab_size, 0)
    runtime.step(plan, tokens, optimizer_step=False)
    times = []
    for _ in range(repeats):
        result = runtime.step(plan, tokens, optimizer_step=False)
        times.append(max(s.end_s for s in result.spans))
    memory = runtime.step(plan, tokens, optimizer_step=False, track_memory=True)
    rows = sum(s.tokens for s in memory.spans if s.kind == "F")
    return {"rank": rank, "stage": runtime.stage, "replica": runtime.replica, "times_s": times,
            "peak_activation_bytes": memory.peak_activation_bytes, "forward_rows": rows}


def measured_step_time(per_rank: list[dict[str, Any]]) -> float:
    """The fastest repeat of the slowest rank's step (other jobs on a shared machine only add time;
    calibration takes the fastest repeat too)."""
    repeats = len(per_rank[0]["times_s"])
    return min(max(r["times_s"][i] for r in per_rank) for i in range(repeats))


def measured_activation_peaks(per_rank: list[dict[str, Any]], pp: int) -> list[float]:
    return [max((r["peak_activation_bytes"] for r in per_rank if r["stage"] == s), default=0) for s in range(pp)]


def predicted_activation_peaks(result: SimResult, cost: CostModel, pp: int,
                               pipeline_cp: Mapping[int, int] | None = None) -> list[float]:
    """Per stage, the highest sum of kept activations over time (forward start adds a group's bytes,
    backward end frees them; frees first at equal instants), the maximum over pipelines. A pipeline
    of cp > 1 (``pipeline_cp``, by pipeline; default the layout's) keeps 1/cp of it per rank."""
    peaks = [0.0] * pp
    for pipeline in {s.pipeline for s in result.spans}:
        cp = (pipeline_cp or {}).get(pipeline)
        for stage in range(pp):
            events = []
            for s in result.spans:
                if s.pipeline != pipeline or s.stage != stage or s.kind not in ("F", "B"):
                    continue
                kept = cost.activation_bytes(s.tokens, virtual_stage=s.chunk * pp + stage, cp=cp)
                events.append((s.start_s, 1, kept) if s.kind == "F" else (s.end_s, 0, -kept))
            level = 0.0
            for _, _, delta in sorted(events):
                level += delta
                peaks[stage] = max(peaks[stage], level)
    return peaks
