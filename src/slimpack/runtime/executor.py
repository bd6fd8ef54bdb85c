"""The stage executor: runs ``F g`` / ``B g`` actions of a pipeline's groups on one model stage.

How a stage keeps forward and backward groupings independent (SlimPack's asymmetric partitioning)
without recomputation or ``retain_graph``:

- **Cells** (``slimpack.plan.cells``). The slices of forward group g that belong to backward group b form the cell (g, b).
  A forward action runs all cells of its group together, layer by layer, but each cell gets its
  own autograd graph: the row-wise work (norms, projections, MLP) and the attention call are packed
  per cell. Symmetric plans have one cell per group, so the whole group is packed. A backward
  action runs the graphs of its cells, and nothing else.
- **K/V leaves.** After a layer's Q/K/V projection, a cell's K and V are also published as
  detached leaves (``k.detach().requires_grad_()``) for the later slices of the same samples that
  run in other cells. Those slices read them as attention prefix pieces, so their backward
  accumulates dK/dV into the leaves' ``.grad`` instead of entering the earlier slice's graph. The
  earlier slice's backward then starts from its output gradient plus, for every layer, K and V
  seeded with the accumulated leaf gradients. This is also why backward must run later slices first.
- **Within a cell**, consecutive slices of one sample are one attention segment: [a, b) and [b, c)
  together are exactly [a, c).
- **Stage boundaries.** A stage > 0 receives its group's input as a tensor and returns the gradient
  of that input from backward; a stage < last returns its output from forward and takes the output
  gradient in backward. Rows follow the group's slice order (forward group for activations, backward
  group for gradients), which is what a P2P transfer carries. The output is not kept for backward:
  a scalar anchor (``_OutputPort``) stands in as the graph root, and the gradient is injected there.

- **Context parallelism** (``shard``, ``cp_group``): the stage holds only its zigzag share of every
  slice (``cells``); inputs, outputs and gradients have this rank's rows only. Each layer
  all-gathers a cell's K/V over the cp group (``context_parallel``); the gathered K/V are what is
  published for later slices, and each local piece attends to them like a slice to its prefix.
- **Tensor parallelism** (a model from ``tensor_parallel.parallelize_model``): inputs, outputs and
  gradients stay whole on every tp rank; inside a chunk the residual stream is this rank's rows
  (sequence parallelism: ``shard_sequence`` on entry, ``gather_sequence`` on exit), and the
  saved-tensor hooks keep the norms' gathered outputs as shards (``regather_hooks``).

Activations of a cell are freed when its backward has run (the graph is dropped); an action whose
dependencies are not met raises ``ScheduleError`` naming the action and the missing dependency.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from slimpack.errors import ScheduleError
from slimpack.plan.cells import CellSpec, GroupLayout, Run, fmt_slice
from slimpack.plan.types import Slice
from slimpack.runtime import context_parallel
from slimpack.runtime.attention import KVPiece, resolve_backend, varlen_attention
from slimpack.runtime.loss import count_loss_tokens, slice_targets, token_losses
from slimpack.runtime.memory import ActivationTracker
from slimpack.runtime.model import Attend, ModelStage
from slimpack.runtime.tensor_parallel import (
    gather_sequence,
    is_sequence_parallel,
    regather_hooks,
    shard_sequence,
)


@dataclass(frozen=True, slots=True)
class _Piece:
    start: int
    end: int
    k_tkd: torch.Tensor
    v_tkd: torch.Tensor


@dataclass(frozen=True, slots=True)
class _CellIndex:
    """A cell's index tensors on the device: built for every cell when the executor is made (one
    host-to-device copy per plan, none per action)."""

    positions: torch.Tensor
    """Each row's position in its sample (RoPE)."""
    fg_rows: torch.Tensor | None
    """Rows in the forward group's layout (None: the identity)."""
    bg_rows: torch.Tensor | None
    """Rows in the backward group's layout (None: the identity)."""
    gather: tuple[torch.Tensor, int] | None
    """``gather_rows``'s (row index, padded rows per rank) under context parallelism, else None."""


def _cell_indices(layout: GroupLayout, device: torch.device) -> dict[tuple[int, int], _CellIndex]:
    """Every cell's ``_CellIndex``, cut from one tensor copied to the device once."""
    specs = [spec for cells in layout.cells.values() for spec in cells]
    values: list[int] = []
    spans: list[list[tuple[int, int] | None]] = []
    widths = []
    for spec in specs:
        gather = layout.gather_order(spec) if layout.shard[1] > 1 else None
        widths.append(gather[1] if gather is not None else 0)
        parts = [[q for p in spec.pieces for q in range(p.start, p.end)],
                 None if spec.fg_identity else spec.fg_rows, None if spec.bg_identity else spec.bg_rows,
                 None if gather is None else gather[0]]
        spans.append([])
        for part in parts:
            spans[-1].append(None if part is None else (len(values), len(values) + len(part)))
            values.extend(part or [])
    flat = torch.tensor(values, dtype=torch.long).to(device)

    def cut(span: tuple[int, int] | None) -> torch.Tensor | None:
        return None if span is None else flat[span[0]:span[1]]

    indices = {}
    for spec, (positions, fg, bg, gather), width in zip(specs, spans, widths, strict=True):
        gathered = cut(gather)
        indices[spec.key] = _CellIndex(positions=cut(positions), fg_rows=cut(fg), bg_rows=cut(bg),  # type: ignore[arg-type]
                                       gather=None if gathered is None else (gathered, width))
    return indices


@dataclass
class _CellState:
    """What a forwarded cell keeps until its backward."""

    spec: CellSpec
    x_te: torch.Tensor | None
    """The input leaf (stages > 0): its ``.grad`` is the input gradient."""
    root: torch.Tensor | None = None
    """The graph root: the cell's loss (last stage) or its ``_OutputPort`` anchor."""
    port: _GradHolder | None = None
    """Where backward puts the output gradient (stages < last)."""
    kv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """Per layer with published K/V: (k, v in the graph, k leaf, v leaf)."""
    published: list[tuple[int, int, _Piece]] = field(default_factory=list)
    """(sample, layer, piece) entries this cell put in the K/V cache."""
    handles: list[Any] = field(default_factory=list)


class _OutputPort(torch.autograd.Function):
    """Graph root standing in for a stage's output: forward returns a scalar anchor and keeps
    nothing; backward hands on the gradient placed in ``holder.grad``."""

    @staticmethod
    def forward(ctx: Any, x_te: torch.Tensor, holder: _GradHolder) -> torch.Tensor:
        ctx.holder = holder
        return x_te.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _anchor: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad, ctx.holder.grad = ctx.holder.grad, None
        return grad, None


class _GradHolder:
    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


def _attention_order(specs: Sequence[CellSpec], name: str) -> list[int]:
    """Indices of a forward group's cells, each after the cells holding earlier slices of its
    samples: a layer runs cell by cell, and a cell's attention reads those cells' K/V of the same
    layer as its prefix. Valid plans have such an order (a cycle would also deadlock backward)."""
    def reads(later: CellSpec, earlier: CellSpec) -> bool:
        return any(a.sample_id == b.sample_id and b.end <= a.start for a in later.runs for b in earlier.runs)

    left, order = list(range(len(specs))), []
    while left:
        ready = next((i for i in left if not any(j != i and reads(specs[i], specs[j]) for j in left)), None)
        if ready is None:
            raise ScheduleError(f"{name}: the cells {[specs[i].key for i in left]} read each other's K/V")
        order.append(ready)
        left.remove(ready)
    return order


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class StageExecutor:
    """Runs forward and backward actions of one pipeline's groups on one ``ModelStage``.

    ``forward`` and ``backward`` are group lists (forward groups, backward groups) that partition the
    same slices; ``F g`` runs forward group g, ``B g`` backward group g. ``sample_lengths`` gives
    every sample's length (each sample's slices must tile [0, length)). ``tokens`` (sample id → ids)
    is needed on the first stage (inputs) and the last (targets). ``num_loss_tokens`` normalises the
    loss; it must count the whole global batch (default: this pipeline's samples only).
    ``shard`` = (cp rank, cp) and ``cp_group`` (a process group of the cp ranks) run the stage
    context-parallel.
    """

    def __init__(self, stage: ModelStage, forward: Sequence[Sequence[Slice]],
                 backward: Sequence[Sequence[Slice]], *, sample_lengths: Mapping[int, int],
                 tokens: Mapping[int, torch.Tensor] | None = None, num_loss_tokens: int | None = None,
                 backend: str = "auto", name: str = "stage", tracker: ActivationTracker | None = None,
                 shard: tuple[int, int] = (0, 1), cp_group: Any = None) -> None:
        if shard[1] > 1 and cp_group is None:
            raise ValueError(f"{name}: context parallelism over {shard[1]} ranks needs their process group")
        self.stage = stage
        self.cp_group = cp_group
        self.name = name
        param = next(stage.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.backend = resolve_backend(backend, self.device, self.dtype)
        self.tracker = tracker
        if (stage.has_embedding or stage.has_head) and tokens is None:
            raise ValueError(f"{name}: the first and last stages need the token ids of every sample")
        self.tokens = {sid: t.to(self.device) for sid, t in (tokens or {}).items()}
        self.layout = GroupLayout(forward, backward, sample_lengths, name=name, shard=shard)
        self.forward_groups, self.backward_groups = self.layout.forward, self.layout.backward
        self.lengths = self.layout.lengths
        self._index = _cell_indices(self.layout, self.device)
        # per forward group, the order its cells run each layer in (a plan property: found once)
        self._cell_orders = {g: _attention_order(specs, name) for g, specs in self.layout.cells.items()}
        self.num_loss_tokens = (num_loss_tokens if num_loss_tokens is not None
                                else count_loss_tokens(self.lengths[s] for s in self.layout.by_sample))
        self._forwarded: set[Slice] = set()
        self._backwarded: set[Slice] = set()
        self._live: dict[tuple[int, int], _CellState] = {}
        self._kv: dict[int, list[list[_Piece]]] = {}

    @property
    def finished(self) -> bool:
        """Every slice has run its forward and its backward on this stage."""
        return len(self._backwarded) == len(self.layout.fg_of)

    @property
    def live_cells(self) -> int:
        """Cells whose forward has run and whose backward has not (graphs held)."""
        return len(self._live)

    def unfinished(self) -> list[Slice]:
        return [s for s in self.layout.fg_of if s not in self._backwarded]

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, group: int, inputs: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``F group``. Stages > 0 take the group's input (T, E) in forward-group row order.

        Returns the output (T, E) on stages < last; on the last stage the per-position
        cross-entropy (T,) (zero where no loss), whose sum / num_loss_tokens is the group's loss.
        """
        action = f"F{group}"
        if not 0 <= group < len(self.forward_groups):
            raise ScheduleError(f"{action} on {self.name}: there are {len(self.forward_groups)} forward groups")
        slices = self.forward_groups[group]
        members = set(slices)
        for s in slices:
            if s in self._forwarded:
                raise ScheduleError(f"{action} on {self.name}: slice {fmt_slice(s)} has already run its forward")
            for earlier in self.layout.by_sample[s.sample_id]:
                if earlier.start < s.start and earlier not in self._forwarded and earlier not in members:
                    raise ScheduleError(
                        f"{action} on {self.name}: slice {fmt_slice(s)} needs the forward of earlier slice "
                        f"{fmt_slice(earlier)} (F{self.layout.fg_of[earlier]}) first")
        num_tokens = self.layout.group_tokens("F", group)
        if self.stage.has_embedding:
            if inputs is not None:
                raise ValueError(f"{action} on {self.name}: the first stage embeds tokens and takes no input")
        elif inputs is None or tuple(inputs.shape) != (num_tokens, self.stage.config.hidden):
            got = None if inputs is None else tuple(inputs.shape)
            raise ValueError(f"{action} on {self.name}: expected an input of shape "
                             f"({num_tokens}, {self.stage.config.hidden}), got {got}")
        specs = self.layout.cells[group]
        with self._recording(), torch.enable_grad():
            states, outputs = self._forward_cells(specs, inputs, self._cell_orders[group])
        self._forwarded |= members
        for state in states:
            self._live[state.spec.key] = state
        for s in slices:  # a sample whose forward is complete needs no cache on this stage
            if all(t in self._forwarded for t in self.layout.by_sample[s.sample_id]):
                self._kv.pop(s.sample_id, None)
        return self._to_group_layout(specs, outputs, num_tokens)

    def _recording(self) -> Any:
        """Saved-tensor hooks: the memory tracker's, wrapped by sequence parallelism's re-gather."""
        if not is_sequence_parallel(self.stage):
            return self.tracker.recording() if self.tracker is not None else contextlib.nullcontext()
        hooks = (self.tracker.pack, self.tracker.unpack) if self.tracker is not None else (_same, _same)
        return torch.autograd.graph.saved_tensors_hooks(*regather_hooks(*hooks))

    def _forward_cells(self, specs: list[CellSpec], inputs: torch.Tensor | None,
                       order: list[int]) -> tuple[list[_CellState], list[torch.Tensor]]:
        xs: list[torch.Tensor] = []
        tables = []
        leaves: list[torch.Tensor | None] = []
        gathers = [self._index[spec.key].gather for spec in specs]
        for spec in specs:
            index = self._index[spec.key]
            if self.stage.has_embedding:
                ids = torch.cat([self.tokens[spec.runs[p.run].sample_id][p.start:p.end] for p in spec.pieces]
                                or [torch.zeros(0, dtype=torch.long, device=self.device)])
                xs.append(self.stage.embed(ids))
                leaves.append(None)
            else:
                assert inputs is not None
                rows = inputs if index.fg_rows is None else inputs[index.fg_rows]
                xs.append(rows.detach().requires_grad_())
                leaves.append(xs[-1])
            tables.append(self.stage.position_table(index.positions))
        states = [_CellState(spec=spec, x_te=leaf)
                  for spec, leaf in zip(specs, leaves, strict=True)]
        xs = [shard_sequence(x, self.stage) for x in xs]
        for layer_index in range(len(self.stage.layers)):
            for i in order:
                attend = self._attention(states[i], layer_index, gathers[i])
                xs[i] = self.stage.run_layer(layer_index, xs[i], tables[i], attend)
        outputs = []
        for state, x in zip(states, xs, strict=True):
            if self.stage.has_head:  # the final norm gathers the rows (sequence parallelism)
                targets = torch.cat([slice_targets(self.tokens[state.spec.runs[p.run].sample_id], p.start, p.end)
                                     for p in state.spec.pieces] or [torch.zeros(0, dtype=torch.long, device=self.device)])
                losses_t = token_losses(self.stage.logits(x), targets)
                state.root = losses_t.sum() / max(self.num_loss_tokens, 1)
                outputs.append(losses_t.detach())
            else:
                x = gather_sequence(x)  # the whole rows, for the next stage
                state.port = _GradHolder()
                state.root = _OutputPort.apply(x, state.port)
                outputs.append(x.detach())
        return states, outputs

    def _attention(self, state: _CellState, layer_index: int, gather: tuple[torch.Tensor, int] | None) -> Attend:
        """The attention of one cell in one layer, for the stage's layer to call: publishes the
        cell's K/V for later slices, then attends to the prefix and its own keys."""
        def attend(q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor, scale: float | None) -> torch.Tensor:
            runs = (k_tkd, v_tkd)
            if gather is not None:  # context parallel: every cp rank's K/V rows of the cell
                runs = (context_parallel.gather_rows(k_tkd, *gather, self.cp_group),
                        context_parallel.gather_rows(v_tkd, *gather, self.cp_group))
            self._publish(state, layer_index, *runs)
            return self._attend(state.spec, layer_index, q_thd, (k_tkd, v_tkd), runs, scale)
        return attend

    def _attend(self, spec: CellSpec, layer_index: int, q_thd: torch.Tensor,
                kv_own: tuple[torch.Tensor, torch.Tensor], kv_runs: tuple[torch.Tensor, torch.Tensor],
                scale: float | None = None) -> torch.Tensor:
        """Attention of the cell's pieces. ``kv_own``: K/V of this rank's rows (the pieces' own keys);
        ``kv_runs``: K/V of the cell's whole runs (the same tensors without context parallelism). A
        piece [a, b) of run [s, e) attends to the sample's cache [0, s), then the run's [s, b) as
        views of ``kv_runs`` (no copy). Without context parallelism the piece is its whole run and its
        own keys are ``kv_own``; with it, its own keys [a, b) are read from the gathered ``kv_runs``
        too, so attention's backward keeps the gathered K/V only, not this rank's rows a second time
        (their gradient reaches ``kv_own`` through the gather's reduce-scatter)."""
        gathered = kv_runs[0] is not kv_own[0]
        if not spec.pieces:  # this cp rank holds none of the cell's tokens
            # a zero that depends on the gathered K/V: backward must reach the gather on every cp rank
            # (its reduce-scatter is a collective), with a zero gradient from this one
            anchor = (kv_runs[0].sum() + kv_runs[1].sum()) * 0 if gathered else 0
            return torch.zeros_like(q_thd) + anchor
        starts = [0]
        for run in spec.runs:
            starts.append(starts[-1] + run.end - run.start)
        k_runs, v_runs = kv_runs
        cu, prefix = [0], []
        for p in spec.pieces:
            run = spec.runs[p.run]
            cu.append(cu[-1] + p.end - p.start)
            first = starts[p.run]
            end = first + (p.end if gathered else p.start) - run.start
            earlier = [(k_runs[first:end], v_runs[first:end])] if end > first else []
            prefix.append(self._prefix(run, layer_index) + earlier)
        cu_own = cu
        if gathered:  # no own keys (new empty tensors: a view would keep this rank's K/V alive)
            kv_own = (kv_own[0].new_empty((0, *kv_own[0].shape[1:])), kv_own[1].new_empty((0, *kv_own[1].shape[1:])))
            cu_own = [0] * len(cu)
        return varlen_attention(q_thd, *kv_own, cu, cu_own, prefix=prefix, backend=self.backend, scale=scale)

    def _publish(self, state: _CellState, layer_index: int, k_tkd: torch.Tensor, v_tkd: torch.Tensor) -> None:
        """Put K/V of runs that later slices (in other cells) will read into the cache, as leaves."""
        rows = 0
        k_leaf = v_leaf = None
        for run in state.spec.runs:
            n = run.end - run.start
            if run.end < self.lengths[run.sample_id]:
                if k_leaf is None:
                    k_leaf = k_tkd.detach().requires_grad_()
                    v_leaf = v_tkd.detach().requires_grad_()
                    state.kv.append((k_tkd, v_tkd, k_leaf, v_leaf))
                    if self.tracker is not None:
                        state.handles += [self.tracker.hold(k_leaf), self.tracker.hold(v_leaf)]
                assert v_leaf is not None
                if n == k_leaf.shape[0]:  # the whole leaf: its gradient needs no view's backward
                    piece = _Piece(run.start, run.end, k_leaf, v_leaf)
                else:
                    piece = _Piece(run.start, run.end, k_leaf[rows:rows + n], v_leaf[rows:rows + n])
                layers = self._kv.setdefault(run.sample_id, [[] for _ in self.stage.layers])
                layers[layer_index].append(piece)
                state.published.append((run.sample_id, layer_index, piece))
            rows += n

    def _prefix(self, run: Run, layer_index: int) -> list[KVPiece]:
        """K/V pieces covering [0, run.start) of the run's sample, in position order."""
        if run.start == 0:
            return []
        pieces = sorted((p for p in self._kv.get(run.sample_id, [[]] * (layer_index + 1))[layer_index]
                         if p.end <= run.start), key=lambda p: p.start)
        at = 0
        for p in pieces:
            assert p.start == at, (run, [(q.start, q.end) for q in pieces])
            at = p.end
        assert at == run.start, (run, at)
        return [(p.k_tkd, p.v_tkd) for p in pieces]

    def _to_group_layout(self, specs: list[CellSpec], outputs: list[torch.Tensor], num_tokens: int) -> torch.Tensor:
        if len(specs) == 1 and specs[0].fg_identity:
            return outputs[0]
        out = outputs[0].new_empty((num_tokens, *outputs[0].shape[1:]))
        for spec, rows in zip(specs, outputs, strict=True):
            fg_rows = self._index[spec.key].fg_rows
            out[slice(None) if fg_rows is None else fg_rows] = rows
        return out

    # ---- backward ------------------------------------------------------------------------------
    def backward(self, group: int, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run ``B group``. Stages < last take the output gradient (T, E) in backward-group row order.

        Returns the input gradient (T, E) in backward-group row order on stages > 0, else None.
        Parameter gradients accumulate in ``.grad``.
        """
        action = f"B{group}"
        if not 0 <= group < len(self.backward_groups):
            raise ScheduleError(f"{action} on {self.name}: there are {len(self.backward_groups)} backward groups")
        slices = self.backward_groups[group]
        members = set(slices)
        for s in slices:
            if s in self._backwarded:
                raise ScheduleError(f"{action} on {self.name}: slice {fmt_slice(s)} has already run its backward")
            if s not in self._forwarded:
                raise ScheduleError(f"{action} on {self.name}: slice {fmt_slice(s)} has not run its forward "
                                    f"(F{self.layout.fg_of[s]}) yet")
            for later in self.layout.by_sample[s.sample_id]:
                if later.start > s.start and later not in self._backwarded and later not in members:
                    raise ScheduleError(
                        f"{action} on {self.name}: slice {fmt_slice(s)} needs the backward of later slice "
                        f"{fmt_slice(later)} (B{self.layout.bg_of[later]}) first")
        num_tokens = self.layout.group_tokens("B", group)
        if self.stage.has_head:
            if grad_output is not None:
                raise ValueError(f"{action} on {self.name}: the last stage starts from the loss; "
                                 f"it takes no output gradient")
        elif grad_output is None or tuple(grad_output.shape) != (num_tokens, self.stage.config.hidden):
            got = None if grad_output is None else tuple(grad_output.shape)
            raise ValueError(f"{action} on {self.name}: expected an output gradient of shape "
                             f"({num_tokens}, {self.stage.config.hidden}), got {got}")
        keys = sorted({(self.layout.fg_of[s], group) for s in slices})
        grad_input = None
        if not self.stage.has_embedding:
            grad_input = torch.zeros((num_tokens, self.stage.config.hidden), device=self.device, dtype=self.dtype)
        for wave in self.layout.waves(keys):
            self._backward_cells([self._live.pop(key) for key in wave], grad_output, grad_input)
        self._backwarded |= members
        return grad_input

    def _backward_cells(self, states: list[_CellState], grad_output: torch.Tensor | None,
                        grad_input: torch.Tensor | None) -> None:
        roots: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        for state in states:
            assert state.root is not None
            roots.append(state.root)
            grads.append(torch.ones_like(state.root))
            if state.port is not None:
                assert grad_output is not None
                bg_rows = self._index[state.spec.key].bg_rows
                state.port.grad = grad_output if bg_rows is None else grad_output[bg_rows]
            for k, v, k_leaf, v_leaf in state.kv:
                for tensor, leaf in ((k, k_leaf), (v, v_leaf)):
                    if leaf.grad is not None:
                        roots.append(tensor)
                        grads.append(leaf.grad)
        torch.autograd.backward(roots, grads)
        for state in states:
            if grad_input is not None:
                assert state.x_te is not None and state.x_te.grad is not None
                bg_rows = self._index[state.spec.key].bg_rows
                if bg_rows is None:
                    grad_input.copy_(state.x_te.grad)
                else:
                    grad_input[bg_rows] = state.x_te.grad
            for sample_id, layer_index, piece in state.published:
                layers = self._kv.get(sample_id)
                if layers is not None:
                    layers[layer_index] = [p for p in layers[layer_index] if p is not piece]
            if self.tracker is not None:
                for handle in state.handles:
                    self.tracker.release(handle)
