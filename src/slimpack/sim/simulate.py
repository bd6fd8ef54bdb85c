"""Deterministic DAG simulation of one training step of a Plan.

Each pipeline's actions form a DAG (``schedule.dag``); with durations from the cost model an action
starts when its device is free and its inputs have arrived (producer's end + P2P transfer time on
cross-stage edges), so the step's timeline is a longest-path computation in topological order:
deterministic and exact for the model, with no event-queue tie-breaking. After its last backward,
every stage all-reduces its gradients over the data-parallel group (ring, once all replicas have
reached that point) and runs the optimizer; the step ends when the slowest stage is done.

Memory per device: model states, plus each slice's kept activations from the start of the forward
that computes it until the end of the backward that consumes it, plus the working set of the action
running (one layer's full activations).
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slimpack.cost import CostModel, model_training_flops
from slimpack.plan.check import check_plan
from slimpack.plan.types import Group, PipelinePlan, Plan, segments
from slimpack.schedule.dag import P2P, build_graph, topological_order
from slimpack.schedule.default import default_order
from slimpack.sim.result import DeviceMemory, SimResult, Span


def _group_arrays(groups: Sequence[Group]) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(tokens, prefix, total tokens) of each group's attention segments."""
    out = []
    for group in groups:
        tokens, prefix = zip(*segments(group), strict=True)
        out.append((np.array(tokens, dtype=np.int64), np.array(prefix, dtype=np.int64), sum(tokens)))
    return out


class _PipelineRun:
    """Timeline and memory of one pipeline."""

    def __init__(self, plan: Plan, index: int, cost: CostModel) -> None:
        self.index = index
        pipe: PipelinePlan = plan.pipelines[index]
        par = plan.config.parallel
        self.pp, self.chunks = par.pp, par.virtual_stages
        self.cp = pipe.cp
        self.width = len(pipe.replicas)  # merged replicas count as that many pipelines' GPUs
        self.fwd = _group_arrays(pipe.forward)
        self.bwd = _group_arrays(pipe.backward)
        order = default_order(pipe, plan.config, cost)
        graph = build_graph(pipe, order, pp=self.pp, chunks=self.chunks, where=f"pipelines[{index}]")
        topo = topological_order(graph, where=f"pipelines[{index}]")
        self.graph = graph
        cache: dict[tuple[str, int, bool, bool], float] = {}
        num_chunks = self.pp * self.chunks
        duration = [0.0] * len(graph.nodes)
        for node, (_, action) in enumerate(graph.nodes):
            vstage = graph.virtual_stage(node)
            key = (action.kind, action.group, vstage == 0, vstage == num_chunks - 1)
            if key not in cache:
                tokens, prefix, _ = (self.fwd if action.kind == "F" else self.bwd)[action.group]
                cache[key] = cost.group_time(tokens, prefix, virtual_stage=vstage,
                                             backward=action.kind == "B", cp=self.cp)
            duration[node] = cache[key]
        start = [0.0] * len(graph.nodes)
        end = [0.0] * len(graph.nodes)
        p2p_cache: dict[tuple[str, int, int, int], float] = {}
        for node in topo:
            ready = 0.0
            device, action = graph.nodes[node]
            for pred, kind in graph.preds[node]:
                arrival = end[pred]
                if kind == P2P:
                    src = graph.nodes[pred][0]
                    key = (action.kind, action.group, src, device)
                    if key not in p2p_cache:
                        tokens = (self.fwd if action.kind == "F" else self.bwd)[action.group][2]
                        p2p_cache[key] = cost.p2p_time(tokens, from_stage=src, to_stage=device, cp=self.cp)
                    arrival += p2p_cache[key]
                ready = max(ready, arrival)
            start[node] = ready
            end[node] = ready + duration[node]
        self.start, self.end, self.duration = start, end, duration
        self.group_times = self._middle_stage_times(cost)

    def _middle_stage_times(self, cost: CostModel) -> tuple[tuple[float, ...], tuple[float, ...]]:
        vstage = (self.pp * self.chunks) // 2
        def times(groups: list[tuple[np.ndarray, np.ndarray, int]], backward: bool) -> tuple[float, ...]:
            return tuple(cost.group_time(t, p, virtual_stage=vstage, backward=backward, cp=self.cp)
                         for t, p, _ in groups)
        return times(self.fwd, False), times(self.bwd, True)

    def device_end(self, device: int) -> float:
        return max((self.end[n] for n, (d, _) in enumerate(self.graph.nodes) if d == device), default=0.0)

    def spans(self) -> list[Span]:
        out = []
        for node, (device, action) in enumerate(self.graph.nodes):
            tokens = (self.fwd if action.kind == "F" else self.bwd)[action.group][2]
            out.append(Span(self.index, device, action.kind, action.group, action.chunk,
                            self.start[node], self.end[node], tokens))
        return out

    def memory(self, cost: CostModel, device: int) -> DeviceMemory:
        """Live bytes on ``device``: per-slice kept activations plus the running action's working set."""
        states = cost.model_state_bytes(device)
        events: list[tuple[float, int, float]] = []  # (time, 0 = free first / 1 = allocate, bytes)
        for node, (d, action) in enumerate(self.graph.nodes):
            if d != device:
                continue
            vstage = self.graph.virtual_stage(node)
            tokens = (self.fwd if action.kind == "F" else self.bwd)[action.group][2]
            kept = cost.activation_bytes(tokens, virtual_stage=vstage, cp=self.cp)
            work = cost.working_bytes(tokens, cp=self.cp)
            if action.kind == "F":
                events.append((self.start[node], 1, kept))
            else:
                events.append((self.end[node], 0, -kept))
            events.append((self.start[node], 1, work))
            events.append((self.end[node], 0, -work))
        events.sort(key=lambda e: (e[0], e[1]))
        times, live, level = [0.0], [states], states
        for time, _, delta in events:
            level += delta
            if times[-1] == time:
                live[-1] = level
            else:
                times.append(time)
                live.append(level)
        return DeviceMemory(pipeline=self.index, stage=device, model_state_bytes=states,
                            times_s=tuple(times), live_bytes=tuple(live))


def simulate(plan: Plan, cost: CostModel | None = None, *, check: bool = True) -> SimResult:
    """Simulate one step of ``plan``. ``check`` runs the plan checker first (the default)."""
    cost = cost or CostModel(plan.config)
    if check:
        check_plan(plan, cost)
    config = plan.config
    par = config.parallel
    runs = [_PipelineRun(plan, p, cost) for p in range(len(plan.pipelines))]
    spans: list[Span] = [span for run in runs for span in run.spans()]
    busy = sum(run.width * sum(run.duration) for run in runs)
    compute_end = max((span.end_s for span in spans), default=0.0)
    step_time = 0.0
    for stage in range(par.pp):
        ready = max((run.device_end(stage) for run in runs), default=0.0)
        sync = cost.grad_sync_time(stage)
        optim = cost.optimizer_time(stage)
        for run in runs:
            spans.append(Span(run.index, stage, "sync", -1, 0, ready, ready + sync, 0))
            spans.append(Span(run.index, stage, "optim", -1, 0, ready + sync, ready + sync + optim, 0))
        step_time = max(step_time, ready + sync + optim)
    stage_devices = par.pp * par.dp
    ideal = busy / stage_devices
    lengths = plan.sample_lengths()
    deferred = set(plan.deferred)
    run_lengths = [length for sid, length in lengths.items() if sid not in deferred]
    num_tokens = sum(run_lengths)
    model_flops = sum(model_training_flops(config.model, n) for n in run_lengths)
    memory = tuple(run.memory(cost, d) for run in runs for d in range(par.pp))
    peak = tuple(max((m.peak_bytes for m in memory if m.stage == d), default=0.0) for d in range(par.pp))
    capacity = config.cluster.usable_memory_bytes
    bubble = 1.0 - busy / (stage_devices * compute_end) if compute_end > 0 else 0.0
    return SimResult(
        strategy=plan.strategy, step=plan.step, step_time_s=step_time, ideal_time_s=ideal,
        efficiency=ideal / step_time if step_time > 0 else 0.0, bubble_fraction=bubble,
        num_tokens=num_tokens, tokens_per_s=num_tokens / step_time if step_time > 0 else 0.0,
        mfu=model_flops / (step_time * par.num_devices * config.cluster.peak_flops) if step_time > 0 else 0.0,
        num_gpus=par.num_devices, peak_memory_bytes=peak, memory_capacity_bytes=capacity,
        oom=any(p > capacity for p in peak),
        forward_group_times_s=tuple(run.group_times[0] for run in runs),
        backward_group_times_s=tuple(run.group_times[1] for run in runs),
        spans=tuple(spans), memory=memory)
