"""Deterministic DAG simulation of one training step of a Plan.

Each pipeline's actions form a DAG (``schedule.dag``); with durations from the cost model an action
starts when its device is free and its inputs have arrived (producer's end + P2P transfer time on
cross-stage edges), so the step's timeline is a longest-path computation in topological order:
deterministic and exact for the model, with no event-queue tie-breaking. After its last backward,
every stage all-reduces its gradients over the data-parallel group (ring, once all replicas have
reached that point) and runs the optimizer; the step ends when the slowest stage is done.

An action is charged as the runtime runs it: one cost-model call per cell of its group (``plan.cells``:
the slices it shares with one group of the other direction), so an asymmetric group of k cells
pays k calls' fixed costs and runs k smaller GEMMs.

The ideal step time is the whole-document work of the trained samples over the GPUs
(``CostModel.whole_document_seconds``), the same for every plan of the same samples; the plan's own
modelled work (``work_time_s``) is reported beside it.

Memory per device: model states, plus each slice's kept activations from the start of the forward
that computes it until the end of the backward that consumes it, plus the working set of the action
running (one layer's full activations).
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from itertools import chain, repeat

import numpy as np

from slimpack.config import Config
from slimpack.cost import CostModel, model_training_flops
from slimpack.plan.cells import pipeline_cells
from slimpack.plan.check import check_groups, schedule_graph
from slimpack.plan.types import PipelinePlan, Plan, group_tokens
from slimpack.schedule.actions import slice_columns
from slimpack.sim.result import DeviceMemory, SimResult, Span

CellArrays = tuple[np.ndarray, np.ndarray]
"""A cell as the cost model takes it: tokens and prefix (float, as the cost model computes with it)
of each of its attention segments."""


def group_cells(pipe: PipelinePlan, *, where: str = "pipeline") -> tuple[list[list[CellArrays]], list[list[CellArrays]]]:
    """(per forward group, per backward group) the cells it runs, each as its segments' arrays:
    what one action costs is the sum of one cost-model call per cell (the runtime runs each cell as
    its own GEMMs and attention call). A forward group's cells are in their order in the group; a
    backward group's in forward-group order."""
    forward: list[list[CellArrays]] = []
    backward: list[list[CellArrays]] = [[] for _ in pipe.backward]
    for cells in pipeline_cells(pipe.forward, pipe.backward, name=where):
        forward.append([])
        for cell in cells:
            arrays = (np.array([r.end - r.start for r in cell.runs], dtype=np.int64),
                      np.array([r.start for r in cell.runs], dtype=np.float64))
            forward[-1].append(arrays)
            backward[cell.key[1]].append(arrays)
    return forward, backward


class CellTable:
    """A pipeline's cells as flat arrays (token total and attention-term sum per cell), so the cost
    model prices every cell of the pipeline on a chunk in one call: the same values, bit for bit,
    as one ``group_time`` call per cell (``group_cells``), at a fraction of the Python overhead."""

    def __init__(self, pipe: PipelinePlan, cp: int, cost: CostModel, *, where: str) -> None:
        self.cp = cp
        all_runs: list = []
        firsts: list[int] = []  # index of each cell's first run
        self.members: dict[str, list[list[int]]] = {"F": [], "B": [[] for _ in pipe.backward]}
        """Per group, its cells: a forward group's in their order in the group, a backward group's
        in forward-group order (as ``group_cells`` lists them)."""
        for cells in pipeline_cells(pipe.forward, pipe.backward, name=where):
            self.members["F"].append([])
            for cell in cells:
                self.members["F"][-1].append(len(firsts))
                self.members["B"][cell.key[1]].append(len(firsts))
                firsts.append(len(all_runs))
                all_runs.extend(cell.runs)
        _, starts, ends = slice_columns(all_runs, len(all_runs))
        # each cell's token total and attention-term sum, as ``group_sums`` gives them for one cell
        self.totals, self.attention = cost.groups_sums(ends - starts, starts, np.array(firsts, dtype=np.intp), cp)
        self._group_of = {kind: np.repeat(np.arange(len(groups)), [len(cells) for cells in groups])[
            np.argsort(np.fromiter(chain.from_iterable(groups), dtype=np.intp, count=len(firsts)), kind="stable")]
            for kind, groups in self.members.items()}
        """Per kind, each cell's group (a group's cells are in rising cell order, so ``np.bincount``
        adds them left to right, as a loop over the group's cells would)."""
        self.group_tokens = {kind: self._group_sums(kind, self.totals).astype(np.int64).tolist() for kind in "FB"}
        self.counts = tuple(tuple(len(cells) for cells in self.members[kind]) for kind in "FB")

    def _group_sums(self, kind: str, per_cell: np.ndarray) -> np.ndarray:
        return np.bincount(self._group_of[kind], weights=per_cell, minlength=len(self.members[kind]))

    def group_times(self, cost: CostModel, kind: str, vstage: int, cross_node: bool | None = None) -> list[float]:
        """Per group of ``kind``, its time on ``vstage``: the sum of its cells' times (``cross_node``:
        whether the pipeline's cp group spans nodes there)."""
        return self._group_sums(kind, cost.cells_time(self.totals, self.attention, virtual_stage=vstage,
                                                       backward=kind == "B", cp=self.cp,
                                                       cross_node=cross_node)).tolist()


class _PipelineRun:
    """Timeline and memory of one pipeline. Per-node values live in flat lists indexed by node id:
    the simulator's hot loops run over tens of thousands of nodes (see docs/sim-speed.md)."""

    def __init__(self, config: Config, pipe: PipelinePlan, index: int, cost: CostModel) -> None:
        """``pipe``, pipeline ``index`` of a plan of ``config``."""
        self.index = index
        par = config.parallel
        self.pp, self.chunks = par.pp, par.virtual_stages
        self.cp = pipe.cp
        self.width = len(pipe.replicas)  # merged replicas count as that many pipelines' GPUs
        self._cells = CellTable(pipe, self.cp, cost, where=f"pipelines[{index}]")
        graph, topo = schedule_graph(pipe, config, where=f"pipelines[{index}]")
        self.graph = graph
        num = len(graph.p2p_input)
        device, group, forward, vstage = graph.device, graph.group, graph.forward, graph.vstage
        self.first = graph.first
        tokens = np.zeros(num, dtype=np.int64)
        for kind, mine in (("F", forward), ("B", ~forward)):
            tokens[mine] = np.array(self._cells.group_tokens[kind], dtype=np.int64)[group[mine]]
        # a group's time depends on its chunk only through the chunk's layer count, the embedding
        # (first chunk), the head (last chunk) and whether the stage's cp group spans nodes (a
        # DP-Merge group can straddle a node boundary on some stages and not on others)
        layers = par.chunk_layers(config.model.num_layers)
        last = self.pp * self.chunks - 1
        crosses = [cost.cp_crosses_nodes(pipe.replicas, stage) if self.cp > 1 else None for stage in range(self.pp)]
        shapes = [(layers[v], v == 0, v == last, crosses[v % self.pp]) for v in range(last + 1)]
        times: dict[tuple, list[float]] = {}
        duration = np.zeros(num)
        for v, shape in enumerate(shapes):
            for kind, of_kind in (("F", forward), ("B", ~forward)):
                if (kind, shape) not in times:
                    times[(kind, shape)] = self._cells.group_times(cost, kind, v, shape[3])
                mine = of_kind & (vstage == v)
                duration[mine] = np.array(times[(kind, shape)])[group[mine]]
        self.vstage, self.forward, self.tokens = vstage, forward, tokens
        self.duration = duration.tolist()
        self.start, self.end = self._timeline(cost, graph.p2p_input, device, topo, pipe.replicas)
        self.device_end = [max(self.end[self.first[d]:self.first[d + 1]], default=0.0) for d in range(self.pp)]
        middle = shapes[(self.pp * self.chunks) // 2]
        self.group_times = tuple(tuple(times[(kind, middle)]) for kind in "FB")
        self.group_cells = self._cells.counts

    def _timeline(self, cost: CostModel, p2p_input: list[int], device: np.ndarray, topo: list[int],
                  replicas: tuple[int, ...]) -> tuple[list[float], list[float]]:
        """Longest path in topological order: a node starts when its device is free and its
        cross-stage input is in (its producer's end plus the P2P transfer between the ranks of
        ``replicas``). Its other inputs run on
        its own device before it (``dep`` edges join actions of one virtual stage), so they end by
        the time its device is free and leave the start unchanged."""
        num = len(p2p_input)
        after_own = np.zeros(num, dtype=bool)  # whether the node before it is on its device
        after_own[1:] = device[1:] == device[:-1]
        previous = np.where(after_own, np.arange(num) - 1, -1)  # the device's previous action
        # every transfer priced in one elementwise call
        sources = np.array(p2p_input, dtype=np.intp)
        hops = np.flatnonzero(sources >= 0)
        delays = np.zeros(num)
        delays[hops] = cost.p2p_time(self.tokens[hops], from_stage=device[sources[hops]], to_stage=device[hops],
                                     cp=self.cp, replicas=replicas)
        start, end, duration = [0.0] * num, [0.0] * num, self.duration
        before_of, hop_delay = previous.tolist(), delays.tolist()
        for node in topo:
            before = before_of[node]
            ready = end[before] if before >= 0 else 0.0
            src = p2p_input[node]
            if src >= 0 and end[src] + hop_delay[node] > ready:
                ready = end[src] + hop_delay[node]
            start[node] = ready
            end[node] = ready + duration[node]
        return start, end

    def spans(self) -> list[Span]:
        graph = self.graph
        kinds = np.where(graph.forward, "F", "B").tolist()
        rows = zip(repeat(self.index), graph.device.tolist(), kinds, graph.group.tolist(),
                   (graph.vstage // self.pp).tolist(), self.start, self.end, self.tokens.tolist(), strict=False)
        return list(map(partial(tuple.__new__, Span), rows))

    def memory(self, cost: CostModel) -> list[DeviceMemory]:
        """Live bytes per device: per-group kept activations plus the running action's working set.
        Every action makes three events: its forward allocates its kept activations at its start
        (its backward frees them at its end), and its working set is held from its start to its
        end. A device's events, in the order they happen (at equal times frees first, then in
        node order), run a total from its model states; array operations that add the same terms
        in the same order as a running total would."""
        tokens, vstage, forward = self.tokens.astype(np.float64), self.vstage, self.forward
        kept = np.zeros(len(tokens))
        for v in np.unique(vstage).tolist():
            mine = vstage == v
            kept[mine] = cost.activation_bytes(tokens[mine], virtual_stage=v, cp=self.cp)
        work = np.broadcast_to(cost.working_bytes(tokens, cp=self.cp), tokens.shape)
        start, end = np.array(self.start), np.array(self.end)
        # per node, its three events (time, 0 = free / 1 = allocate, bytes)
        times = np.stack([np.where(forward, start, end), start, end], axis=1)
        allocates = np.stack([forward, np.ones_like(forward), np.zeros_like(forward)], axis=1)
        deltas = np.stack([np.where(forward, kept, -kept), work, -work], axis=1)
        out = []
        for device in range(self.pp):
            rows = slice(self.first[device], self.first[device + 1])
            out.append(self._step_function(cost, device, times[rows].ravel(), allocates[rows].ravel(),
                                           deltas[rows].ravel()))
        return out

    def _step_function(self, cost: CostModel, device: int, times: np.ndarray, allocates: np.ndarray,
                       deltas: np.ndarray) -> DeviceMemory:
        states = cost.model_state_bytes(device)
        by_flag = np.argsort(allocates, kind="stable")  # two stable sorts: by time, then frees first
        order = by_flag[np.argsort(times[by_flag], kind="stable")]
        at = np.concatenate([[0.0], times[order]])
        level = np.add.accumulate(np.concatenate([[states], deltas[order]]))  # left to right, as a loop adds
        last = np.ones(len(at), dtype=bool)  # an instant's level is the one after its last event
        last[:-1] = at[:-1] != at[1:]
        return DeviceMemory(pipeline=self.index, stage=device, model_state_bytes=states,
                            times_s=tuple(at[last].tolist()), live_bytes=tuple(level[last].tolist()))


def _ready(runs: Sequence[_PipelineRun], pp: int) -> list[float]:
    """Per stage, when its last pipeline's last backward ends (the gradient all-reduce waits for it)."""
    return [max((run.device_end[stage] for run in runs), default=0.0) for stage in range(pp)]


def _step_end(ready: Sequence[float], cost: CostModel) -> float:
    """The step's end: the latest stage's gradient all-reduce and optimizer step after ``ready``."""
    return max((at + cost.grad_sync_time(stage) + cost.optimizer_time(stage) for stage, at in enumerate(ready)),
               default=0.0)


def step_time(plan: Plan, cost: CostModel | None = None, *, give_up_at: float = float("inf")) -> float:
    """``simulate(plan, check=False).step_time_s``, bit for bit, without the spans and memory. A step
    that must end after ``give_up_at`` may be given up early: the time returned is then above
    ``give_up_at`` (a lower bound of the step), after simulating only the pipelines that show it
    (the most tokens first), which makes ruling out a slower candidate plan cheap."""
    tokens = [sum(map(group_tokens, pipe.forward)) for pipe in plan.pipelines]
    heavy_first = sorted(range(len(plan.pipelines)), key=lambda p: (-tokens[p], p))
    return pipelines_step_time(plan.config, ((p, plan.pipelines[p]) for p in heavy_first), cost,
                               give_up_at=give_up_at)


def pipelines_step_time(config: Config, pipelines: Iterable[tuple[int, PipelinePlan]], cost: CostModel | None = None,
                        *, give_up_at: float = float("inf")) -> float:
    """``step_time`` of a plan of ``config`` made of ``pipelines`` (each with its index in the plan),
    simulated one by one as the iterable yields them: a caller can build a candidate's pipelines
    lazily and stop building as soon as the step is given up."""
    cost = cost or CostModel(config)
    return _step_end(_ready(_runs_until(config, pipelines, cost, give_up_at), config.parallel.pp), cost)


def step_and_peak(plan: Plan, cost: CostModel | None = None) -> tuple[float, float]:
    """``simulate(plan, check=False)``'s step time and its highest peak memory of any device
    (``max(peak_memory_bytes)``), bit for bit, without building the spans: what a planner scores a
    candidate on."""
    return pipelines_step_and_peak(plan.config, enumerate(plan.pipelines), cost)


def pipelines_step_and_peak(config: Config, pipelines: Iterable[tuple[int, PipelinePlan]],
                            cost: CostModel | None = None, *, give_up_at: float = float("inf")
                            ) -> tuple[float, float]:
    """``step_and_peak`` of a plan of ``config`` made of ``pipelines``, given up like
    ``pipelines_step_time``: a step returned above ``give_up_at`` is a lower bound, and so is
    the peak (of the pipelines simulated until then)."""
    cost = cost or CostModel(config)
    runs = _runs_until(config, pipelines, cost, give_up_at)
    peak = max((m.peak_bytes for run in runs for m in run.memory(cost)), default=0.0)
    return _step_end(_ready(runs, config.parallel.pp), cost), peak


def _runs_until(config: Config, pipelines: Iterable[tuple[int, PipelinePlan]], cost: CostModel,
                give_up_at: float) -> list[_PipelineRun]:
    """``pipelines`` simulated in the order given, until the step they make passes ``give_up_at``
    (it only grows as pipelines are added: the step ends after every pipeline's last backward). A
    step that only reaches it goes on: a lower bound equal to ``give_up_at`` would tie with the
    candidate that set it, and a tie can win (hypothesis seed 406 found a SlimPack plan whose
    ``step_s`` was such a bound, 0.007% under its simulated step)."""
    pp = config.parallel.pp
    runs: list[_PipelineRun] = []
    for index, pipe in pipelines:
        runs.append(_PipelineRun(config, pipe, index, cost))
        if give_up_at < float("inf") and _step_end(_ready(runs, pp), cost) > give_up_at:
            break
    return runs


def simulate(plan: Plan, cost: CostModel | None = None, *, check: bool = True,
             document_lengths: Sequence[int] | None = None) -> SimResult:
    """Simulate one step of ``plan``. ``check`` runs the plan checker first (the default).

    ``document_lengths``: the whole documents the plan trains, for the ideal step time and MFU, when
    its samples are pieces of them (fixed-length packing cuts documents at sequence boundaries);
    by default the plan's trained samples."""
    cost = cost or CostModel(plan.config)
    if check:
        check_groups(plan)  # the schedule's checks run as each pipeline's graph is built
    config = plan.config
    par = config.parallel
    runs = [_PipelineRun(plan.config, pipe, p, cost) for p, pipe in enumerate(plan.pipelines)]
    spans: list[Span] = [span for run in runs for span in run.spans()]
    busy = sum(run.width * sum(run.duration) for run in runs)
    compute_end = max((span.end_s for span in spans), default=0.0)
    ready = _ready(runs, par.pp)
    for stage in range(par.pp):
        sync = cost.grad_sync_time(stage)
        optim = cost.optimizer_time(stage)
        for run in runs:
            spans.append(Span(run.index, stage, "sync", -1, 0, ready[stage], ready[stage] + sync, 0))
            spans.append(Span(run.index, stage, "optim", -1, 0, ready[stage] + sync, ready[stage] + sync + optim, 0))
    step_time = _step_end(ready, cost)
    stage_devices = par.pp * par.dp
    work = busy / stage_devices
    run_lengths = np.asarray([s.length for s in plan.trained_samples], dtype=np.float64)
    num_tokens = int(run_lengths.sum())
    if document_lengths is not None:
        assert sum(document_lengths) == num_tokens, (sum(document_lengths), num_tokens)
        run_lengths = np.asarray(document_lengths, dtype=np.float64)
    ideal = cost.whole_document_seconds(run_lengths) / par.num_devices
    model_flops = float(np.sum(model_training_flops(config.model, run_lengths)))
    memory = tuple(m for run in runs for m in run.memory(cost))
    peak = tuple(max((m.peak_bytes for m in memory if m.stage == d), default=0.0) for d in range(par.pp))
    capacity = config.cluster.usable_memory_bytes
    bubble = 1.0 - busy / (stage_devices * compute_end) if compute_end > 0 else 0.0
    return SimResult(
        strategy=plan.strategy, step=plan.step, step_time_s=step_time, ideal_time_s=ideal, work_time_s=work,
        efficiency=ideal / step_time if step_time > 0 else 0.0, bubble_fraction=bubble,
        num_tokens=num_tokens, tokens_per_s=num_tokens / step_time if step_time > 0 else 0.0,
        mfu=model_flops / (step_time * par.num_devices * config.cluster.peak_flops) if step_time > 0 else 0.0,
        num_gpus=par.num_devices, peak_memory_bytes=peak, memory_capacity_bytes=capacity,
        oom=any(p > capacity for p in peak),
        forward_group_times_s=tuple(run.group_times[0] for run in runs),
        backward_group_times_s=tuple(run.group_times[1] for run in runs),
        forward_group_cells=tuple(run.group_cells[0] for run in runs),
        backward_group_cells=tuple(run.group_cells[1] for run in runs),
        spans=tuple(spans), memory=memory)
