"""The ONE cost model: time, memory and communication of a group of slices on a pipeline stage.

Every planner, the simulator and the benchmarks call this class; nothing else computes costs.
A *group* is a list of slices ``(tokens c_i, prefix p_i)`` run as one unit; times are per device
(one of the tp·cp GPUs that run a stage together), for one model chunk ("virtual stage": the layers
of a pipeline stage, or one of its chunks under interleaving).

Time of a layer's forward for a group (per device):
  overhead + GEMM(T) + attention + elementwise(T) + tensor- and context-parallel collectives
with T = Σc_i, GEMM(T) = lin·T/(tp·cp) / (peak·gemm_max·n/(n+n_half)) at n = T/cp tokens per device,
attention summed per slice with its own efficiency at c_i/cp query tokens (small slices run
below peak), and elementwise(T) the memory-bound per-token kernels at a fraction of HBM bandwidth.
See ``slimpack.config.efficiency`` for the efficiency curve and ``flops`` for FLOPs.
Backward = 2x GEMM + 2.5x attention FLOPs at the backward attention efficiency + 2x elementwise +
the backward's collectives + the forward work recomputation repeats.
The collectives are those the runtime issues (``layer_collectives``), each a ring over its group, not
overlapped with computation (the runtime waits for each before the work that reads it). A ring whose
ranks lie on more than one node runs at the inter-node link: which ranks a group holds follows from
the rank layout (``ParallelConfig.rank``), so a DP-Merge group of replicas that straddles a node
boundary pays it even with fewer ranks than a node has (``cp_crosses_nodes``).

A group is charged as the runtime runs it: the simulator calls ``group_time`` once per *cell* (see
``slimpack.plan.cells``), so an asymmetric plan's forward group of k cells pays k calls' overheads.

Because GEMM(T) = k·(T + cp·n_half) and every collective's time are affine in T, a group's time on a
stage is ``group_constant + Σ slice_cost`` exactly at the layout's cp; planners use that additive form.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slimpack.config import Config
from slimpack.cost import flops, memory
from slimpack.cost.comm import Collective, group_link, ring_allreduce_time
from slimpack.errors import UserError

ArrayLike = np.ndarray | list[int] | tuple[int, ...]

# Tensor-parallel collectives of one layer's pass, each on the (T, E) layer input, (forward, backward).
# With sequence parallelism (Korthikanti et al. §4.2.2) forward runs an all-gather before and a
# reduce-scatter after both the attention and the MLP block; backward runs their conjugates per block
# (the output gradient's all-gather, the input gradient's reduce-scatter) plus a second all-gather of
# the QKV and MLP-up inputs, which Megatron does not keep gathered and re-gathers for the weight
# gradients. Without sequence parallelism: one all-reduce after each block, and in backward one of
# each block's input gradient. runtime.tensor_parallel runs the sequence-parallel lists, in this order.
TP_COLLECTIVES = {
    True: (("all_gather", "reduce_scatter") * 2, ("all_gather", "all_gather", "reduce_scatter") * 2),
    False: (("all_reduce",) * 2, ("all_reduce",) * 2),
}
BACKWARD_OVERHEAD_FACTOR = 2.0  # about twice the kernels of the forward pass
CROSS_ENTROPY_PASSES = 3  # read logits, write softmax, read it back in backward (memory-bound)


@dataclass(frozen=True, slots=True)
class ChunkShape:
    """What one model chunk (virtual stage) holds."""

    num_layers: int
    has_embedding: bool
    has_head: bool


class CostModel:
    """Costs for one ``Config``; cheap to build, safe to share (immutable after construction)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        model, par, eff, cluster = config.model, config.parallel, config.efficiency, config.cluster
        self.model = model
        self.tp = par.tp
        self.cp = par.cp
        self.num_chunks = par.pp * par.virtual_stages
        self.chunk_layers = par.chunk_layers(model.num_layers)
        # The additive slice costs describe the chunk with the most layers: the pipeline's
        # bottleneck when the stage split is even, and the one planners must balance for otherwise.
        self.layers_per_chunk = max(self.chunk_layers)
        self.recompute = config.train.recompute
        self._gemm_rate = cluster.peak_flops * eff.gemm_max
        self._attn_rate = cluster.peak_flops * eff.attention_max
        self._attn_backward_rate = cluster.peak_flops * eff.attention_backward_max
        self._tp_collectives = TP_COLLECTIVES[par.sequence_parallel]
        # filled on first use per (pass, cp, whether the cp ring crosses nodes): a cache, the same
        # values whoever fills it; gradient sync times per stage likewise
        self._comm_coefficients: dict[tuple[bool, int, bool | None], tuple[float, float]] = {}
        self._grad_sync: dict[int, float] = {}
        self._pipeline_nodes: dict[tuple[int, ...], np.ndarray] = {}
        self._hops_within_node: dict[tuple[int, ...], np.ndarray] = {}
        # seconds per token per layer of the memory-bound kernels on one device (tp shards them)
        self._elementwise = 0.0 if eff.elementwise_bandwidth is None else (
            flops.elementwise_elements_per_token(model) * model.dtype_bytes / par.tp
            / (cluster.hbm_bandwidth * eff.elementwise_bandwidth))
        self._lin = flops.linear_flops_per_token(model)
        self._attn_per_pair = flops.attention_flops_per_pair(model)
        self._head = flops.lm_head_flops_per_token(model)
        ops = config.train.layer_ops
        self._act_bytes_layer = memory.activation_bytes_per_token(
            model, recompute=self.recompute, tp=par.tp, cp=1, sequence_parallel=par.sequence_parallel, layer_ops=ops)
        self._working_bytes_layer = memory.working_bytes_per_token(
            model, tp=par.tp, cp=1, sequence_parallel=par.sequence_parallel, layer_ops=ops)
        self._kv_bytes = {recompute: memory.gathered_kv_bytes_per_token(model, recompute=recompute, tp=par.tp)
                          for recompute in (self.recompute, "none")}
        self._logit_bytes = memory.logits_bytes_per_token(model, tp=par.tp, cp=1)
        self._head_input_bytes = memory.head_input_bytes_per_token(
            model, tp=par.tp, cp=1, sequence_parallel=par.sequence_parallel, layer_ops=ops)
        # bytes of the hidden state per token on one device (sharded by tp under SP)
        self._attn_half = eff.attention_half_tokens
        self._coefficients = {b: self._additive_coefficients(b) for b in (False, True)}
        hidden_bytes = model.hidden * model.dtype_bytes
        self._p2p_bytes_per_token = hidden_bytes / par.tp if par.sequence_parallel else hidden_bytes

    # ---- layout ---------------------------------------------------------------------------
    def chunk_shape(self, virtual_stage: int) -> ChunkShape:
        assert 0 <= virtual_stage < self.num_chunks, virtual_stage
        return ChunkShape(self.chunk_layers[virtual_stage], virtual_stage == 0, virtual_stage == self.num_chunks - 1)

    # ---- time -----------------------------------------------------------------------------
    def attention_terms(self, tokens: np.ndarray, prefix: np.ndarray, cp: int) -> np.ndarray:
        """Per attention segment, its causal pairs over its kernel efficiency (at ``tokens / cp``
        query tokens per device): a group's attention time is proportional to their sum."""
        tok = tokens.astype(np.float64)
        pairs = tok * prefix + tok * (tok + 1.0) / 2.0
        local = tok / cp
        return pairs * (local + self.config.efficiency.attention_half_tokens) / local

    def _layer_parts(self, total, attention: float | np.ndarray, cp: int):
        """(GEMM, attention FLOPs over the forward rate) seconds of one layer's forward for a group
        of ``total`` tokens whose ``attention_terms`` sum to ``attention``, on one device; elementwise
        over arrays of groups (the simulator costs all cells of a pipeline at once)."""
        shards = self.tp * cp
        # an empty group costs nothing (a mask keeps one formula for scalars and arrays)
        gemm = self._lin / shards / self._gemm_rate * (total + cp * self.config.efficiency.gemm_half_tokens) * (total > 0)
        return gemm, attention * (self._attn_per_pair / shards / self._attn_rate)

    def layer_collectives(self, tokens: float, *, backward: bool, cp: int | None = None) -> tuple[Collective, ...]:
        """The collectives one device runs for one layer's forward (or backward) of a group of
        ``tokens`` tokens, as the runtime issues them (tests/runtime/test_comm_accounting.py).
        Tensor parallel: ``TP_COLLECTIVES`` on the layer input (T/cp rows of the hidden size).
        Context parallel (``runtime.context_parallel``): forward all-gathers the group's K and then
        its V over the cp ranks (this device's kv_hidden/tp columns of all T rows), backward
        reduce-scatters dK and dV: the gathered K/V are kept for backward, so nothing is re-sent."""
        cp = cp or self.cp
        found: list[Collective] = []
        if self.tp > 1:
            size = tokens / cp * self.model.hidden * self.model.dtype_bytes
            found += [Collective(kind, "tp", self.tp, size) for kind in self._tp_collectives[backward]]
        if cp > 1:
            size = tokens * self.model.kv_hidden / self.tp * self.model.dtype_bytes
            found += [Collective("reduce_scatter" if backward else "all_gather", "cp", cp, size)] * 2
        return tuple(found)

    def _comm_coefficients_of(self, backward: bool, cp: int, cross_node: bool | None = None) -> tuple[float, float]:
        """(seconds per token, seconds per call) of ``layer_collectives`` (affine in tokens).
        ``cross_node``: whether the cp group spans nodes (``cp_crosses_nodes``); None: as a group of
        tp·cp consecutive ranks aligned to the nodes, which the layout's own cp groups are."""
        key = (backward, cp, cross_node)
        if key not in self._comm_coefficients:
            cp_link = (group_link(self.config.cluster, self.tp * cp) if cross_node is None
                       else self.config.cluster.link(same_node=not cross_node))
            links = {"tp": self.config.cluster.link(same_node=True), "cp": cp_link}
            at = [sum(c.time(*links[c.group]) for c in self.layer_collectives(n, backward=backward, cp=cp))
                  for n in (0.0, 1.0)]
            self._comm_coefficients[key] = (at[1] - at[0], at[0])
        return self._comm_coefficients[key]

    def _comm_time(self, tokens: float, *, backward: bool, cp: int, cross_node: bool | None = None) -> float:
        per_token, constant = self._comm_coefficients_of(backward, cp, cross_node)
        return (per_token * tokens + constant) * (tokens > 0)

    def layer_time(self, tokens: ArrayLike, prefix: ArrayLike, *, backward: bool, cp: int | None = None) -> float:
        """Seconds one device spends on one transformer layer's forward (or backward) of a group."""
        cp = cp or self.cp
        total, attention = self.group_sums(tokens, prefix, cp)
        return float(self._layer_seconds(total, attention, backward=backward, cp=cp))

    def group_sums(self, tokens: ArrayLike, prefix: ArrayLike, cp: int) -> tuple[float, float]:
        """A group's token total and the sum of its ``attention_terms`` (0 for an empty group): with
        ``cells_time`` on arrays of them, ``group_time`` of many groups at once."""
        tokens = np.asarray(tokens, dtype=np.int64)
        total = float(tokens.sum())
        if total <= 0:
            return total, 0.0
        return total, float(np.sum(self.attention_terms(tokens, np.asarray(prefix, dtype=np.float64), cp)))

    def groups_sums(self, tokens: np.ndarray, prefix: np.ndarray, firsts: np.ndarray, cp: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """``group_sums`` of many non-empty groups at once: ``tokens`` and ``prefix`` hold every
        group's segments one group after another, ``firsts`` the index of each group's first. The
        same values, bit for bit (``reduceat`` sums a group's terms as ``np.sum`` sums its array)."""
        if not len(firsts):
            return np.zeros(0), np.zeros(0)
        terms = self.attention_terms(tokens, prefix.astype(np.float64), cp)
        return np.add.reduceat(tokens, firsts).astype(np.float64), np.add.reduceat(terms, firsts)

    def _layer_seconds(self, total, attention, *, backward: bool, cp: int, cross_node: bool | None = None):
        """``layer_time`` from a group's token total and attention-term sum (elementwise on arrays)."""
        gemm, attn = self._layer_parts(total, attention, cp)
        overhead = self.config.efficiency.layer_overhead_s
        elementwise = self._elementwise * total / cp
        forward = overhead + gemm + attn + elementwise + self._comm_time(total, backward=False, cp=cp, cross_node=cross_node)
        if not backward:
            return forward
        attn_backward = flops.ATTENTION_BACKWARD_FACTOR * attn * self._attn_rate / self._attn_backward_rate
        time = (BACKWARD_OVERHEAD_FACTOR * overhead + flops.GEMM_BACKWARD_FACTOR * gemm
                + attn_backward + flops.ELEMENTWISE_BACKWARD_FACTOR * elementwise
                + self._comm_time(total, backward=True, cp=cp, cross_node=cross_node))
        if self.recompute == "full":
            time += forward
        elif self.recompute == "selective":
            time += attn
        return time

    def group_time(self, tokens: ArrayLike, prefix: ArrayLike, *, virtual_stage: int,
                   backward: bool, cp: int | None = None) -> float:
        """Seconds one device spends on the forward (or backward) of a group on a model chunk."""
        cp = cp or self.cp
        total, attention = self.group_sums(tokens, prefix, cp)
        return float(self.cells_time(total, attention, virtual_stage=virtual_stage, backward=backward, cp=cp))

    def cells_time(self, totals, attention, *, virtual_stage: int, backward: bool, cp: int,
                   cross_node: bool | None = None):
        """``group_time`` of groups given by their token totals and ``attention_terms`` sums; on
        arrays, of every group at once, equal bit for bit to one ``group_time`` call per group.
        ``cross_node``: whether their cp group spans nodes (``cp_crosses_nodes``; None: aligned)."""
        shape = self.chunk_shape(virtual_stage)
        time = shape.num_layers * self._layer_seconds(totals, attention, backward=backward, cp=cp,
                                                      cross_node=cross_node)
        if shape.has_head:
            time = time + self.head_time(totals, cp, backward) * (totals > 0)
        if shape.has_embedding:
            time = time + self.embedding_time(totals, cp) * (totals > 0)
        return time

    def head_time(self, total: float, cp: int, backward: bool) -> float:
        """Seconds the final norm, LM head and loss add to a group of ``total`` tokens (last chunk)."""
        eff = self.config.efficiency
        gemm = self._head / (self.tp * cp) / self._gemm_rate * (total + cp * eff.gemm_half_tokens)
        logits = total / cp * self._logit_bytes * CROSS_ENTROPY_PASSES / self.config.cluster.hbm_bandwidth
        factor = flops.GEMM_BACKWARD_FACTOR if backward else 1.0
        return factor * gemm + logits

    def head_cost_per_token(self, *, backward: bool) -> float:
        """Seconds per token the LM head and loss add to the last chunk (their time is affine in
        tokens), cp = layout cp: what balancing groups for the last stage adds to ``slice_cost``."""
        return self.head_time(1.0, self.cp, backward) - self.head_time(0.0, self.cp, backward)

    def embedding_time(self, total: float, cp: int) -> float:
        """Seconds the embedding adds to a group of ``total`` tokens (first chunk)."""
        # a memory-bound gather (forward) or scatter-add (backward) of T·h elements
        size = total / cp * self.model.hidden * self.model.dtype_bytes
        return 2 * size / self.config.cluster.hbm_bandwidth

    def _additive_coefficients(self, backward: bool) -> tuple[float, float]:
        """(seconds per token, seconds per attention pair at full efficiency) of a middle chunk."""
        shards = self.tp * self.cp
        gemm = self._lin / shards / self._gemm_rate
        attn = self._attn_per_pair / shards / self._attn_rate
        elementwise = self._elementwise / self.cp
        comm = {b: self._comm_coefficients_of(b, self.cp)[0] for b in (False, True)}
        forward_per_token = gemm + elementwise + comm[False]
        if not backward:
            per_token, per_pair = forward_per_token, attn
        else:
            per_token = (flops.GEMM_BACKWARD_FACTOR * gemm + flops.ELEMENTWISE_BACKWARD_FACTOR * elementwise
                         + comm[True])
            per_pair = flops.ATTENTION_BACKWARD_FACTOR * self._attn_per_pair / shards / self._attn_backward_rate
            if self.recompute == "full":
                per_token, per_pair = per_token + forward_per_token, per_pair + attn
            elif self.recompute == "selective":
                per_pair += attn
        return self.layers_per_chunk * per_token, self.layers_per_chunk * per_pair

    def slice_cost(self, tokens: float, prefix: float, *, backward: bool) -> float:
        """Additive part of one slice's time on a middle chunk (no embedding/head), cp = layout cp;
        ``tokens`` >= 1. Plain arithmetic, so it also accepts numpy arrays (see ``slice_costs``)."""
        return self.slice_cost_function(backward=backward)(tokens, prefix)

    def slice_cost_function(self, *, backward: bool, extra_per_token: float = 0.0):
        """``slice_cost`` as a function of (tokens, prefix) with its coefficients bound, plus
        ``extra_per_token`` seconds per token: planners call it hundreds of thousands of times."""
        per_token, per_pair = self._coefficients[backward]
        per_token += extra_per_token
        cp, half = self.cp, self._attn_half

        def cost(tokens, prefix):
            local = tokens / cp
            return per_token * tokens + per_pair * (tokens * prefix + tokens * (tokens + 1.0) / 2.0) * (local + half) / local

        return cost

    def slice_costs(self, tokens: ArrayLike, prefix: ArrayLike, *, backward: bool) -> np.ndarray:
        """``slice_cost`` of each slice. ``group_constant(backward) + slice_costs(...).sum()`` equals
        ``group_time`` on a middle chunk when cp == 1."""
        return self.slice_cost(np.asarray(tokens, dtype=np.float64), np.asarray(prefix, dtype=np.float64),
                               backward=backward)

    def group_constant(self, *, backward: bool) -> float:
        """Per-group part of a middle chunk's time that does not grow with tokens (see slice_costs)."""
        eff = self.config.efficiency
        gemm0 = self._lin / (self.tp * self.cp) / self._gemm_rate * self.cp * eff.gemm_half_tokens
        latency = {b: self._comm_coefficients_of(b, self.cp)[1] for b in (False, True)}
        forward = eff.layer_overhead_s + gemm0 + latency[False]
        if not backward:
            per_layer = forward
        else:
            per_layer = (BACKWARD_OVERHEAD_FACTOR * eff.layer_overhead_s + flops.GEMM_BACKWARD_FACTOR * gemm0
                         + latency[True])
            if self.recompute == "full":
                per_layer += forward
        return self.layers_per_chunk * per_layer

    def whole_document_seconds(self, lengths: ArrayLike) -> float:
        """GPU-seconds of one training pass (forward + backward) of whole documents of these lengths,
        each unsliced, with no overheads: every layer's GEMMs, attention (forward and backward at
        their own efficiencies) and memory-bound kernels, the LM head and its cross-entropy, at full
        kernel efficiency (no small-call penalty, fixed costs, communication or recomputation).
        Divided by the number of GPUs it is the ideal step time (DESIGN.md §3): the same for every
        strategy that trains the same documents."""
        length = np.asarray(lengths, dtype=np.float64)
        total, pairs = float(length.sum()), float(np.sum(length * (length + 1.0) / 2.0))
        per_token = ((1.0 + flops.GEMM_BACKWARD_FACTOR) * self._lin / self._gemm_rate
                     + (1.0 + flops.ELEMENTWISE_BACKWARD_FACTOR) * self._elementwise * self.tp)
        per_pair = self._attn_per_pair * (1.0 / self._attn_rate
                                          + flops.ATTENTION_BACKWARD_FACTOR / self._attn_backward_rate)
        head = ((1.0 + flops.GEMM_BACKWARD_FACTOR) * self._head / self._gemm_rate
                + self._logit_bytes * self.tp * CROSS_ENTROPY_PASSES / self.config.cluster.hbm_bandwidth)
        return self.model.num_layers * (per_token * total + per_pair * pairs) + head * total

    # ---- memory ---------------------------------------------------------------------------
    def activation_bytes(self, tokens: float, *, virtual_stage: int, cp: float | None = None) -> float:
        """Bytes one device keeps for a group of ``tokens`` tokens from its forward to its backward
        (``cp=math.inf``: the part no context parallelism divides)."""
        cp = cp or self.cp
        shape = self.chunk_shape(virtual_stage)
        kept = shape.num_layers * self.layer_activation_bytes(tokens, cp=cp)
        if shape.has_head:
            kept += (self._logit_bytes + self._head_input_bytes) * tokens / cp
        return kept

    def stage_activation_bytes(self, tokens: float, *, stage: int, cp: float | None = None) -> float:
        """Bytes pipeline stage ``stage`` keeps for ``tokens`` tokens held on every model chunk it
        runs (one chunk without interleaving): what it holds of a group once the group's forwards
        have run on all its chunks and before its first backward there frees any."""
        par = self.config.parallel
        return sum(self.activation_bytes(tokens, virtual_stage=chunk * par.pp + stage, cp=cp)
                   for chunk in range(par.virtual_stages))

    def sample_floor_bytes(self, tokens: float, *, cp: float) -> float:
        """The least peak memory of the fullest stage for any plan that trains a sample of
        ``tokens`` tokens over ``cp`` context-parallel ranks: model states plus the sample's kept
        activations on every chunk of the stage. All forwards of a sample's slices on a chunk run
        before the backward of its last slice there, so at that moment all of them are held,
        however the sample is sliced or grouped; and every cp rank keeps the whole sample's K and V,
        so no cp brings this below the states plus those (``cp=math.inf`` gives that limit)."""
        return max(self.model_state_bytes(stage) + self.stage_activation_bytes(tokens, stage=stage, cp=cp)
                   for stage in range(self.config.parallel.pp))

    def layer_activation_bytes(self, tokens: float, *, cp: float | None = None) -> float:
        """Bytes one device keeps per transformer layer for ``tokens`` tokens (no stage extras)."""
        share = memory.context_parallel_share(self._act_bytes_layer, self._kv_bytes[self.recompute], cp or self.cp)
        return share * tokens

    def working_bytes(self, tokens: float, *, cp: int | None = None) -> float:
        """Transient bytes while one layer of a group of ``tokens`` tokens runs."""
        return memory.context_parallel_share(self._working_bytes_layer, self._kv_bytes["none"], cp or self.cp) * tokens

    def stage_params(self, stage: int) -> float:
        """Parameters one device of pipeline stage ``stage`` holds (all its chunks), sharded by tp."""
        par = self.config.parallel
        model = self.model
        params = 0.0
        for chunk in range(par.virtual_stages):
            shape = self.chunk_shape(chunk * par.pp + stage)
            params += shape.num_layers * model.layer_params()
            if shape.has_embedding:
                params += model.embedding_params()
            if shape.has_head:
                # a tied head is the embedding itself where the stage holds both; on a later stage
                # it is a copy of its own (the runtime keeps the two equal: ``tied_embedding_sync_time``)
                params += model.hidden + (0 if self.embedding_shares_head_device else model.embedding_params())
        return params / self.tp

    @property
    def embedding_shares_head_device(self) -> bool:
        """Whether the LM head is the input embedding on one device: tied, and one pipeline stage."""
        return self.model.tie_embeddings and self.config.parallel.pp == 1

    def model_state_bytes(self, stage: int) -> float:
        par = self.config.parallel
        return memory.model_state_bytes(self.stage_params(stage), shard_ranks=par.dp * par.cp,
                                        distributed_optimizer=self.config.train.distributed_optimizer)

    def check_states_fit(self) -> None:
        """Raise a ``UserError`` when a stage's parameters, gradients and optimizer states alone
        exceed the GPU's usable memory: no plan can run on such a layout."""
        par = self.config.parallel
        usable = self.config.cluster.usable_memory_bytes
        worst = max(range(par.pp), key=self.model_state_bytes)
        need = self.model_state_bytes(worst)
        if need > usable:
            raise UserError(
                f"{self.model.name} does not fit on {self.config.cluster.name} with tp {par.tp} pp {par.pp} "
                f"dp {par.dp} cp {par.cp}: stage {worst} needs {need / 2**30:.1f} GiB per GPU for parameters, "
                f"gradients and optimizer states alone (usable {usable / 2**30:.1f} GiB); raise tp, pp or dp")

    # ---- communication --------------------------------------------------------------------
    def cp_crosses_nodes(self, replicas: Sequence[int], stage: int) -> bool:
        """Whether the context-parallel group of a pipeline on ``replicas`` (the cp ranks of each,
        with their tp ranks) spans more than one node on ``stage``: its ring then runs at the
        inter-node link. A DP-Merge group that straddles a node boundary does, even one with no
        more ranks than a node has."""
        nodes = self.pipeline_nodes(tuple(replicas))[stage]
        return bool(nodes.min() != nodes.max())

    def replica_nodes(self, replicas: np.ndarray, stage: int) -> tuple[np.ndarray, np.ndarray]:
        """Per replica, the node of its first rank and of its last rank (cp and tp ranks) on ``stage``."""
        par, per_node = self.config.parallel, self.config.cluster.gpus_per_node
        return (par.rank(replicas, stage, 0, 0) // per_node,
                par.rank(replicas, stage, par.cp - 1, par.tp - 1) // per_node)

    def p2p_bytes(self, tokens: float, *, cp: int | None = None) -> float:
        """Bytes one device sends to the next stage for a group (activation; same for its gradient)."""
        return self._p2p_bytes_per_token * tokens / (cp or self.cp)

    def p2p_time(self, tokens: float | np.ndarray, *, from_stage: int | np.ndarray, to_stage: int | np.ndarray,
                 cp: int | None = None, replicas: Sequence[int] = (0,)) -> float | np.ndarray:
        """Seconds to send a group's activations (or their gradients) from one stage to another;
        elementwise over arrays of tokens and stages (the simulator prices every transfer of a
        pipeline in one call). Each rank of the pipeline on ``replicas`` sends to its own
        counterpart on the other stage, all at once, so a hop runs at the inter-node link when any
        pair lies on two nodes (``hops_within_node``)."""
        same_node = self.hops_within_node(tuple(replicas))[np.asarray(from_stage), np.asarray(to_stage)]
        (bw_in, lat_in), (bw_out, lat_out) = (self.config.cluster.link(same_node=s) for s in (True, False))
        bw, lat = np.where(same_node, bw_in, bw_out), np.where(same_node, lat_in, lat_out)
        return self.p2p_bytes(tokens, cp=cp) / bw + lat

    def hops_within_node(self, replicas: tuple[int, ...]) -> np.ndarray:
        """``[from, to]``: whether every rank of the pipeline on ``replicas`` shares a node with its
        counterpart on the other stage (the same replica, cp and tp rank: ``layout_rank``). Where a
        stage's ranks (dp·cp·tp) divide a node, or fill whole nodes, every replica agrees; otherwise
        (e.g. tp2 dp3 on 8-GPU nodes) a replica's hop can cross a node boundary that replica 0's
        does not. Kept per replica set."""
        if replicas not in self._hops_within_node:
            nodes = self.pipeline_nodes(replicas)
            self._hops_within_node[replicas] = (nodes[:, None, :] == nodes[None, :, :]).all(axis=2)
        return self._hops_within_node[replicas]

    def pipeline_nodes(self, replicas: tuple[int, ...]) -> np.ndarray:
        """``[stage, rank]``: the node of every rank (cp and tp ranks of each replica, by
        ``layout_rank``) of a pipeline on ``replicas``, on every stage. Kept per replica set: the
        simulator asks for each pipeline it simulates."""
        if replicas not in self._pipeline_nodes:
            par, per_node = self.config.parallel, self.config.cluster.gpus_per_node
            ranks = np.array([par.rank(r, 0, c, t) for r in replicas for c in range(par.cp) for t in range(par.tp)])
            stage_ranks = par.dp * par.cp * par.tp
            self._pipeline_nodes[replicas] = (ranks[None, :] + stage_ranks * np.arange(par.pp)[:, None]) // per_node
        return self._pipeline_nodes[replicas]

    def grad_sync_time(self, stage: int) -> float:
        """Ring all-reduce (or reduce-scatter + all-gather) of a stage's bf16 gradients over dp·cp:
        the ranks of every replica's cp group on the stage, at the inter-node link if they span
        nodes (the simulator asks once per pipeline simulated, so each stage's is kept)."""
        if stage not in self._grad_sync:
            par = self.config.parallel
            bw, lat = self.config.cluster.link(same_node=not self.cp_crosses_nodes((0, par.dp - 1), stage))
            size = self.stage_params(stage) * memory.GRAD_BYTES
            self._grad_sync[stage] = ring_allreduce_time(size, par.dp * par.cp, bw, lat) + (
                self.tied_embedding_sync_time() if stage in (0, par.pp - 1) else 0.0)
        return self._grad_sync[stage]

    def tied_embedding_sync_time(self) -> float:
        """Seconds to sum a tied embedding's gradient over the first and the last stage, after each
        stage's own all-reduce: every rank of the first stage and its counterpart on the last
        (``layout_rank``) all-reduce their shard as a pair, all pairs at once (0 unless tied over
        several stages)."""
        par = self.config.parallel
        if not self.model.tie_embeddings or self.embedding_shares_head_device:
            return 0.0
        same_node = bool(self.hops_within_node(tuple(range(par.dp)))[0, par.pp - 1])
        bw, lat = self.config.cluster.link(same_node=same_node)
        return ring_allreduce_time(self.model.embedding_params() / self.tp * memory.GRAD_BYTES, 2, bw, lat)

    def optimizer_time(self, stage: int) -> float:
        """Adam step: memory-bound pass over this device's shard of fp32 states, grads and params."""
        par = self.config.parallel
        shard = par.dp * par.cp if self.config.train.distributed_optimizer else 1
        params = self.stage_params(stage) / shard
        traffic = params * (2 * memory.OPTIMIZER_BYTES + memory.GRAD_BYTES + memory.PARAM_BYTES)
        return traffic / self.config.cluster.hbm_bandwidth
