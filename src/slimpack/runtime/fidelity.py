"""Run a plan for real and compare with the simulator's prediction (``slimpack fidelity``).

``measure_rank`` runs on every rank (spawned by ``runtime.launch``): one warm-up step, ``repeats``
timed steps (no optimizer step, so every repeat does the same work), then one more step with the
``ActivationTracker`` on (hooks cost time, so memory is never measured in a timed step). A step's
measured time is the end of the last rank's optimizer span, from the step barrier; the figure is
the fastest repeat. ``predicted_activation_peaks`` gives the simulator's per-stage peak of
bytes kept for backward (what ``ActivationTracker`` counts: no model states, no working set).
With tp or cp > 1 one more step runs under ``CollectiveLog`` and the bytes every rank sent in its
tensor- and context-parallel collectives compare with ``predicted_comm_bytes``, the cost model's
``layer_collectives`` of every simulated forward and backward.
``fidelity_row`` does it all for one strategy: plan, simulate, spawn the ranks, compare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from slimpack.config import Config
from slimpack.cost import CostModel
from slimpack.data import Dataset
from slimpack.errors import UserError
from slimpack.plan.types import Plan
from slimpack.sim import simulate
from slimpack.sim.result import SimResult
from slimpack.strategies.stream import PlanStream

DTYPES = {4: torch.float32, 8: torch.float64, 2: torch.bfloat16}
"""Model dtype by ``ModelConfig.dtype_bytes``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FidelityRow:
    """One plan, predicted by the simulator and measured on this machine."""

    strategy: str
    tokens: int
    groups: int
    predicted_step_s: float
    """The simulator's step time, times ``speed_scale``."""
    speed_scale: float
    """Calibrated / current peak FLOP/s (1 unless re-measured for a machine whose speed drifts)."""
    measured_step_s: float
    predicted_activation_bytes: float
    measured_activation_bytes: float
    predicted_comm_bytes: dict[str, float]
    """Bytes all ranks send in the step's layers' "tp" and "cp" collectives, by the cost model."""
    measured_comm_bytes: dict[str, float]
    """Bytes all ranks sent in collectives on their tp and cp groups: the layers', and on tp also the
    chunk boundaries' all-gathers, the embedding's and the LM head's, which the cost model omits."""

    @property
    def step_error(self) -> float:
        return relative_error(self.predicted_step_s, self.measured_step_s)

    @property
    def memory_error(self) -> float:
        return relative_error(self.predicted_activation_bytes, self.measured_activation_bytes)


def relative_error(predicted: float, measured: float) -> float:
    """Signed relative error of the prediction."""
    return (predicted - measured) / measured if measured else 0.0


def mape(errors: Sequence[float]) -> float:
    """Mean absolute (percentage) error."""
    return sum(abs(e) for e in errors) / len(errors)


def check_layout(config: Config) -> None:
    """Refuse, before any work, a layout the runtime does not run as the cost model assumes."""
    from slimpack.runtime.tensor_parallel import check_sequence_parallel

    try:
        check_sequence_parallel(config)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def fidelity_row(config: Config, dataset: Dataset, strategy: str, *, step: int, repeats: int, threads: int,
                 timeout_s: float, rescale: bool, hf_config: str | None = None) -> FidelityRow:
    """Plan ``step`` of ``dataset`` with ``strategy``, simulate it, run it on pp x dp spawned ranks
    (the home-made model of ``config.model``, or transformers' model of ``hf_config``)."""
    from slimpack.runtime.calibrate import peak_flops
    from slimpack.runtime.launch import LaunchError, spawn

    check_layout(config)
    plan = next(PlanStream(dataset, config, strategy, start=step)).plan
    cost = CostModel(plan.config)
    sim = simulate(plan, cost)
    scale = 1.0
    if rescale:
        torch.set_num_threads(threads)
        scale = config.cluster.peak_flops / peak_flops(DTYPES[plan.config.model.dtype_bytes])
    par = config.parallel
    try:
        per_rank = spawn(measure_rank, par.num_devices, (plan, repeats, threads, hf_config), timeout_s=timeout_s,
                         threads=threads)
    except LaunchError as exc:
        raise UserError(f"{strategy}: the real run failed: {exc}") from None
    return FidelityRow(
        strategy=strategy, tokens=sim.num_tokens, groups=sum(len(p.forward) for p in plan.pipelines),
        predicted_step_s=sim.step_time_s * scale, speed_scale=scale, measured_step_s=measured_step_time(per_rank),
        predicted_activation_bytes=max(predicted_activation_peaks(sim, cost, par.pp,
                                                                  {i: p.cp for i, p in enumerate(plan.pipelines)})),
        measured_activation_bytes=max(measured_activation_peaks(per_rank, par.pp)),
        predicted_comm_bytes=predicted_comm_bytes(sim, cost, plan),
        measured_comm_bytes={label: sum(r["comm_bytes"].get(label, 0.0) for r in per_rank)
                             for label in ("tp", "cp") if any(label in r["comm_bytes"] for r in per_rank)})


def measure_rank(rank: int, world_size: int, plan: Plan, repeats: int, threads: int,
                 hf_config: str | None = None) -> dict[str, Any]:
    from slimpack.runtime.collectives import CollectiveLog
    from slimpack.runtime.distributed import RankRuntime
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.models import build_runtime_model
    from slimpack.runtime.verify import plan_lengths, random_tokens

    torch.set_num_threads(threads)
    model = build_runtime_model(hf_config or plan.config.model, plan.config.model, seed=0,
                                dtype=DTYPES[plan.config.model.dtype_bytes], device="cpu")
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
    groups = {"tp": [runtime.groups.tp_mesh.get_group()] if runtime.groups.tp_mesh is not None else [],
              "cp": runtime.groups.cp_groups()}
    comm = {}
    if any(groups.values()):
        with CollectiveLog({label: g for label, g in groups.items() if g}) as log:
            runtime.step(plan, tokens, optimizer_step=False)
        comm = {label: log.sent_bytes(label) for label, g in groups.items() if g}
    return {"rank": rank, "stage": runtime.stage, "replica": runtime.replica, "times_s": times,
            "peak_activation_bytes": memory.peak_activation_bytes, "forward_rows": rows, "comm_bytes": comm}


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


def predicted_comm_bytes(result: SimResult, cost: CostModel, plan: Plan) -> dict[str, float]:
    """Bytes all ranks send in the layers' tensor- and context-parallel collectives over the step:
    ``layer_collectives`` of every simulated forward and backward (its pipeline's cp), on each layer
    of its chunk and each of the tp·cp devices that run it. Keys: the groups with more than one rank."""
    pp = plan.config.parallel.pp
    totals: dict[str, float] = {}
    for s in result.spans:
        if s.kind not in ("F", "B"):
            continue
        cp = plan.pipelines[s.pipeline].cp
        copies = cost.tp * cp * cost.chunk_shape(s.chunk * pp + s.stage).num_layers
        for c in cost.layer_collectives(s.tokens, backward=s.kind == "B", cp=cp):
            totals[c.group] = totals.get(c.group, 0.0) + copies * c.sent_bytes()
    return totals
