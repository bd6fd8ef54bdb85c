"""The pipeline executor over ``torch.distributed``: each rank runs its stage of the plan.

Every rank of the mesh (``runtime.mesh``) builds the executors of its model chunks (chunk v = c x pp
+ stage, c < virtual stages) for each pipeline its replica takes part in, on its context-parallel
share of the pipeline's tokens (``cells``; a DP-Merge pipeline is context-parallel over the ranks of
all its replicas) and on its tensor-parallel shards of the model (``tensor_parallel``), then walks
its stage's action list
(``pipeline.order[stage]``; a ``Plan`` always carries it) lowered by ``schedule.lowering`` into
receive / compute / send steps: ``F g`` receives the group's activation (this rank's forward-group
rows x hidden) from the previous virtual stage and sends its output to the next; ``B g`` receives the
output gradient (backward-group rows x hidden) from the next and sends its input gradient back.
Shapes come from the plan and dtype from the model, so no shape handshake is needed. Sends do not
block (a stage goes on computing while its output travels); receives do. ``runtime.p2p`` posts
each rank's sends and receives in one global order that both ends of every link share, which is
what keeps NCCL (which ignores tags) from deadlocking. Then:

- After the last action, gradients are summed over each stage's replicas and cp ranks
  (``all_reduce`` on the group of ranks holding the same parameter shards). The loss is normalised
  by the loss tokens of the whole global batch, so the sum equals the single-process gradient of
  ``verify`` exactly (up to summation order).
- The optimizer (any ``torch.optim`` optimizer over the rank's parameters) then steps.

Failure handling (``runtime.waits``): every wait on another rank (the step barrier, each receive,
the completion of sends, compute actions with tensor- or context-parallel collectives, the gradient
and loss all-reduces) is named to a ``WaitMonitor``, which ends the process with one line naming
this rank, the action and the peer rank(s) once the wait outlives ``timeout_s``. The step barrier
is a ``monitored_barrier`` on gloo, which names the missing rank itself.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from slimpack.plan.types import PipelinePlan, Plan
from slimpack.runtime.executor import StageExecutor
from slimpack.runtime.hf_tensor_parallel import parallelize_hf_model
from slimpack.runtime.loss import count_loss_tokens
from slimpack.runtime.memory import ActivationTracker
from slimpack.runtime.mesh import Mesh, ProcessGroups, build_process_groups
from slimpack.runtime.model import ModelStage, Transformer
from slimpack.runtime.p2p import PeerFailure, PipelineLinks
from slimpack.runtime.precision import MixedPrecision
from slimpack.runtime.tensor_parallel import (
    keep_gradients_sharded,
    local,
    loss_context,
    parallelize_model,
    reduce_partial_gradients,
)
from slimpack.runtime.waits import WaitMonitor, fault_point, process_group_timeout
from slimpack.schedule.lowering import Transfer, lower_action, walk
from slimpack.sim.result import Span

DEFAULT_TIMEOUT_S = 300.0


def init(*, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``init_process_group`` from the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT),
    gloo on CPU and NCCL with CUDA unless ``backend`` says otherwise."""
    if dist.is_initialized():
        return
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend=backend, timeout=process_group_timeout(timeout_s))


def check_peers(timeout_s: float, monitor: WaitMonitor, step: int) -> None:
    """The step's barrier. gloo's monitored barrier names the missing rank(s) itself (raises
    ``PeerFailure``); on other backends the monitor covers the barrier."""
    fault_point("barrier", dist.get_rank())
    if dist.get_backend() != "gloo":
        with monitor.waiting(f"step {step}: the step barrier", "another rank"):
            dist.barrier()
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as exc:
        raise PeerFailure(f"rank {dist.get_rank()}: a peer rank did not reach the step barrier within "
                          f"{timeout_s:.0f} s: {str(exc).splitlines()[0]}") from exc


def ranks_text(ranks: Sequence[int]) -> str:
    """Peers a wait depends on, for its message: "rank 3" or "one of ranks 1, 2"."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"one of ranks {', '.join(map(str, ranks))}"


@dataclass
class StepResult:
    loss: float
    """The global batch's loss (summed over every pipeline, identical on every rank)."""
    spans: list[Span] = field(default_factory=list)
    """This rank's actions, gradient sync and optimizer step, in seconds from the step's start."""
    peak_activation_bytes: int = 0
    """With ``track_memory``: the peak over this rank's chunks of bytes kept for backward."""
    wait_s: float = 0.0
    """Time spent blocked in receives."""


class RankRuntime:
    """One rank's part of the runtime: its chunks of ``model``, its groups, its optimizer.

    ``model`` is the whole model, built identically on every rank (same seed); the rank keeps
    references to its chunks only, so the others' parameters are never touched or reduced.
    """

    def __init__(self, model: Transformer, mesh: Mesh, *, virtual_stages: int = 1, stage_layers: Sequence[int] = (),
                 groups: ProcessGroups | None = None, backend: str = "auto",
                 optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, precision: MixedPrecision | None = None) -> None:
        self.mesh = mesh
        self.rank = dist.get_rank()
        self.position = mesh.position(self.rank)
        self.replica, self.stage = self.position.replica, self.position.stage
        self.groups = groups or build_process_groups(mesh, tied_embeddings=model.config.tie_embeddings)
        if mesh.tp > 1:
            parallelize = parallelize_model if isinstance(model, Transformer) else parallelize_hf_model
            parallelize(model, self.groups.tp_mesh)
            if precision is not None:  # the master weights split as their compute copy is
                parallelize(precision.master, self.groups.tp_mesh)
                precision.pair()
            else:
                keep_gradients_sharded(model.parameters())
        self.num_chunks = mesh.pp * virtual_stages
        chunks = model.split(self.num_chunks, stage_layers)
        self.chunk_ids = [c * mesh.pp + self.stage for c in range(virtual_stages)]
        self.chunks: dict[int, ModelStage] = {v: chunks[v] for v in self.chunk_ids}
        seen: set[int] = set()
        self.parameters: list[torch.nn.Parameter] = []
        for v in self.chunk_ids:
            for p in self.chunks[v].parameters():
                if id(p) not in seen:  # tied embeddings appear on the first and the last chunk
                    seen.add(id(p))
                    self.parameters.append(p)
        param = self.parameters[0]
        self.device, self.dtype = param.device, param.dtype
        # mixed precision: ``model`` is the bf16 compute copy; gradients, their reduction and the
        # optimizer are the float32 master weights'
        self.compute_parameters = self.parameters
        self.precision = precision
        if precision is not None:
            self.parameters = precision.masters(self.parameters)
        self.hidden = model.config.hidden
        self.backend = backend
        self.timeout_s = timeout_s
        self.monitor = WaitMonitor(timeout_s, self.rank)
        self.optimizer = optimizer(self.parameters) if optimizer is not None else None
        # a tied embedding over several stages: the first stage's embedding and the last stage's
        # head are one parameter in every process's copy of the model, but two on the mesh; their
        # gradients are summed after each stage's own reduction, so both copies take the same
        # optimizer step and stay equal (Megatron's embedding group)
        self.tied_embedding: torch.nn.Parameter | None = None
        if self.groups.embedding_group is not None:
            embedding = chunks[0].embedding.weight
            assert embedding is chunks[-1].head.weight, "a tied model's head is its embedding"
            self.tied_embedding = embedding if precision is None else precision.masters([embedding])[0]

    def close(self) -> None:
        """Stop watching waits (the monitor's thread ends)."""
        self.monitor.close()

    # ---- one step -------------------------------------------------------------------------------
    def step(self, plan: Plan, tokens: Mapping[int, torch.Tensor], *, track_memory: bool = False,
             optimizer_step: bool = True) -> StepResult:
        """Run the plan's pipelines that this rank takes part in, reduce gradients, step."""
        with loss_context(self.mesh.tp):
            check_peers(self.timeout_s, self.monitor, plan.step)
            return self._step(plan, tokens, track_memory=track_memory, optimizer_step=optimizer_step)

    def _step(self, plan: Plan, tokens: Mapping[int, torch.Tensor], *, track_memory: bool,
              optimizer_step: bool) -> StepResult:
        self.mesh.check_plan(plan)
        others = [r for r in range(self.mesh.world_size) if r != self.rank]
        with self._watched(others, f"step {plan.step}: creating the plan's context-parallel groups"):
            self.groups.ensure_cp_groups(plan)  # collective: every rank creates the same groups
        if plan.config.parallel.virtual_stages * self.mesh.pp != self.num_chunks:
            raise ValueError(f"the plan has {plan.config.parallel.virtual_stages} virtual stages, this runtime "
                             f"was built for {self.num_chunks // self.mesh.pp}")
        lengths = {s.id: s.length for s in plan.trained_samples}
        num_loss = count_loss_tokens(lengths.values())
        for p in self.parameters:
            p.grad = None
        began = time.perf_counter()
        result = StepResult(loss=0.0)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        peaks = []
        for index in self.mesh.pipelines_of(plan, self.rank):
            pipe = plan.pipelines[index]
            used = {s.sample_id for g in pipe.forward for s in g}
            shard = self.mesh.cp_shard(pipe, self.rank)
            cp_group = (self.groups.cp_group(self.mesh.cp_ranks(pipe, self.stage, self.position.tp_rank))
                        if shard[1] > 1 else None)
            executors = {v: StageExecutor(
                self.chunks[v], pipe.forward, pipe.backward,
                sample_lengths={sid: lengths[sid] for sid in used},
                tokens={sid: tokens[sid] for sid in used} if (v == 0 or v == self.num_chunks - 1) else None,
                num_loss_tokens=num_loss, backend=self.backend, name=f"pipeline {index} stage {self.stage}",
                tracker=ActivationTracker(exclude=self.compute_parameters) if track_memory else None,
                shard=shard, cp_group=cp_group)
                for v in self.chunk_ids}
            loss += self._run_pipeline(plan.step, index, pipe, executors, began, result)
            peaks += [e.tracker.peak_bytes for e in executors.values() if e.tracker is not None]
        result.peak_activation_bytes = max(peaks, default=0)
        compute_end = time.perf_counter()
        self._reduce_gradients(plan.step)
        # last-stage ranks hold a loss (each cp rank its tokens' share); tp ranks hold the same one
        loss_t = loss if self.position.tp_rank == 0 else torch.zeros_like(loss)
        fault_point("loss all-reduce", self.rank)
        with self._watched(others, f"step {plan.step}: the loss all-reduce"):
            dist.all_reduce(loss_t)
            result.loss = float(loss_t)  # the step's one host synchronisation
        sync_end = time.perf_counter()
        # the pipeline this rank's replica belongs to (under DP-Merge, not the replica's own index)
        pipeline = next(i for i, pipe in enumerate(plan.pipelines) if self.replica in pipe.replicas)
        result.spans.append(Span(pipeline, self.stage, "sync", -1, 0, compute_end - began, sync_end - began, 0))
        if optimizer_step and self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.precision is not None:
                self.precision.sync()
        end = time.perf_counter()
        result.spans.append(Span(pipeline, self.stage, "optim", -1, 0, sync_end - began, end - began, 0))
        return result

    def _run_pipeline(self, step_index: int, index: int, pipe: PipelinePlan, executors: Mapping[int, StageExecutor],
                      began: float, result: StepResult) -> torch.Tensor:
        assert pipe.order is not None, "a Plan resolves every pipeline's order when it is made"
        pp, chunks = self.mesh.pp, self.num_chunks // self.mesh.pp
        layout = next(iter(executors.values())).layout  # this rank's rows (its cp share)

        def rows(transfer: Transfer) -> int:
            return layout.group_tokens(transfer.kind, transfer.group)

        links = PipelineLinks(walk(pipe.order, chunks=chunks, where=f"pipelines[{index}]"), stage=self.stage,
                              pp=pp, rank_of_stage=lambda stage: self.mesh.peer(self.rank, stage), rows=rows,
                              hidden=self.hidden, dtype=self.dtype, device=self.device, monitor=self.monitor,
                              what=f"step {step_index}: ")
        # compute actions wait on their tensor- and context-parallel peers inside collectives
        collective_peers = sorted(set(self._tp_ranks()) | set(self.mesh.cp_ranks(pipe, self.stage, self.position.tp_rank))
                                  - {self.rank})
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        for action in pipe.order[self.stage]:
            received = None
            start = time.perf_counter()
            for step in lower_action(action, self.stage, pp=pp, chunks=chunks):
                executor = executors[step.vstage]
                if step.op == "recv":
                    received = links.receive(step.transfer)  # type: ignore[arg-type]
                    start = time.perf_counter()
                elif step.op == "compute":
                    with self._watched(collective_peers, f"step {step_index}: computing {action}"):
                        out = (executor.forward if action.kind == "F" else executor.backward)(action.group, received)
                    if action.kind == "F" and step.vstage == self.num_chunks - 1:  # stays on the device
                        loss += out.sum().double() / max(executor.num_loss_tokens, 1)
                else:
                    links.send(step.transfer, out)  # type: ignore[arg-type]
                if step.op == "compute":
                    del received
                    end = time.perf_counter()
            result.spans.append(Span(index, self.stage, action.kind, action.group, action.chunk,
                                     start - began, end - began, layout.group_tokens(action.kind, action.group)))
        links.finish()
        result.wait_s += links.wait_s
        for executor in executors.values():
            if not executor.finished:
                raise RuntimeError(f"{executor.name}: the order leaves slices without backward, e.g. "
                                   f"{tuple(executor.unfinished()[0])}")
        return loss

    def _watched(self, peers: Sequence[int], action: str) -> contextlib.AbstractContextManager[None]:
        return self.monitor.waiting(action, ranks_text(peers)) if peers else contextlib.nullcontext()

    def _tp_ranks(self) -> list[int]:
        pos = self.position
        return [self.mesh.rank(pos.replica, pos.stage, cp_rank=pos.cp_rank, tp_rank=t) for t in range(self.mesh.tp)]

    def _reduce_gradients(self, step: int) -> None:
        """Sum each parameter's gradient over the stage's replicas and cp ranks, as one flat tensor."""
        for p in self.parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        reduce_partial_gradients(self.parameters)
        if self.groups.stage_group is not None:
            grads = [local(p.grad) for p in self.parameters]  # this rank's tensor-parallel shards
            flat = torch.cat([g.reshape(-1) for g in grads])
            fault_point("gradient all-reduce", self.rank)
            peers = [r for r in self.mesh.stage_ranks(self.stage, self.position.tp_rank) if r != self.rank]
            with self.monitor.waiting(f"step {step}: the gradient all-reduce", ranks_text(peers)):
                dist.all_reduce(flat, group=self.groups.stage_group)
            at = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[at:at + n].view_as(g))
                at += n
        if self.tied_embedding is not None:
            weight = self.tied_embedding  # its gradient is split as it is: both ends sum their shard
            pos = self.position
            other = self.mesh.rank(pos.replica, self.mesh.pp - 1 - self.stage, cp_rank=pos.cp_rank, tp_rank=pos.tp_rank)
            with self.monitor.waiting(f"step {step}: the tied embedding's all-reduce", ranks_text([other])):
                dist.all_reduce(local(weight.grad), group=self.groups.embedding_group)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
