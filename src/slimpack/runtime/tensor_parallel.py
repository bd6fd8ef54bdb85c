"""Tensor parallelism of the runtime's model through torch's DTensor API (Megatron's layer split
with sequence parallelism, Korthikanti et al. 2023; the plan torchtitan uses).

``parallelize_model`` hands the model's modules to ``torch.distributed.tensor.parallel.
parallelize_module`` over the tensor-parallel sub-mesh:

- attention: Q, K, V projections column-wise (each rank gets whole heads: rows of ``wq``/``wk``/
  ``wv`` are head-major, so rank t holds query heads [t·H/tp, (t+1)·H/tp) and KV heads
  [t·K/tp, (t+1)·K/tp), which are exactly the KV heads its query heads read under GQA); the output
  projection row-wise, its partial sums reduce-scattered over the rows;
- MLP: gate and up column-wise, down row-wise (reduce-scattered likewise);
- norms (``SequenceParallel``): each rank normalises its own rows (T/tp; ``torch.chunk``'s split, so
  T need not divide by tp); a hook all-gathers the output once for the column-wise projections;
- embedding: vocabulary rows split (row-wise; the partial lookups are all-reduced);
- LM head: vocabulary columns split, after the final norm (sequence-parallel like the others).
  ``vocab_parallel=True`` keeps the logits sharded over the vocabulary and computes the
  cross-entropy with torch's ``loss_parallel`` (a max and a sum-exp all-reduce per token instead of
  gathering T x V logits); ``False`` all-gathers the logits.

The residual stream between layers is a DTensor sharded over the rows: ``shard_sequence`` makes a
chunk's input (replicated: what P2P or the embedding hands over) this rank's rows, and
``gather_sequence`` all-gathers a chunk's output for the next stage. Attention runs on local heads
with plain tensors over all T rows: the column-wise projections hand back local tensors
(``use_local_output``), so ``varlen_attention``, its K/V prefixes and the executor's cells work
unchanged on H/tp query and K/tp KV heads (``Block.num_heads``/``num_kv_heads`` become the per-rank
counts).

Collectives per layer (``cost.model.TP_COLLECTIVES``, tests/runtime/test_comm_accounting.py), each
on the (T, E) layer input: forward, per block an all-gather of the norm output and a
reduce-scatter of the block output; backward, per block an all-gather of the output gradient, a
second all-gather of the norm output (``regather_hooks``: autograd keeps the shard, not the gathered
tensor, as Megatron does) and a reduce-scatter of the input gradient. The norm gains' gradients are
partial sums over each rank's rows, reduced over tp once per step (``reduce_partial_gradients``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from slimpack.config import Config, ModelConfig
from slimpack.runtime.model import Transformer


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    """``ValueError`` unless the model splits into ``tp`` equal shards of whole heads."""
    for what, count in (("attention heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads),
                        ("MLP width", cfg.ffn_hidden), ("vocabulary", cfg.vocab_size)):
        if count % tp:
            raise ValueError(f"tp={tp} does not divide the model's {what} ({count})")


def check_sequence_parallel(config: Config) -> None:
    """``ValueError`` when the layout's ``sequence_parallel`` is not what the runtime runs under tensor
    parallelism: slimpack's layers always run sequence parallelism, transformers' modules never do
    (``hf_tensor_parallel``); the cost model's plan would be for a different run."""
    par = config.parallel
    if par.tp == 1:
        return
    if config.train.layer_ops == "slimpack" and not par.sequence_parallel:
        raise ValueError(f"tp={par.tp} with sequence_parallel false: the runtime's tensor parallelism "
                         f"always runs sequence parallelism; set sequence_parallel true")
    if config.train.layer_ops == "transformers" and par.sequence_parallel:
        raise ValueError(f"tp={par.tp} with sequence_parallel true: transformers' layers run plain tensor "
                         f"parallelism; set sequence_parallel false")


def parallelize_model(model: Transformer, tp_mesh: Any, *, vocab_parallel: bool = True) -> Transformer:
    """Shard ``model``'s layers, embedding and head over ``tp_mesh`` (a 1-D ``DeviceMesh``), in place.

    Every rank must hold the same full weights before the call (the runtime builds them from one
    seed); each keeps its shards.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    check_tensor_parallel(model.config, tp)
    if tp == 1:
        return model
    rows = Shard(0)
    for block in model.layers:
        plan = {"attn_norm": SequenceParallel(sequence_dim=0), "mlp_norm": SequenceParallel(sequence_dim=0),
                "wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
                "wo": RowwiseParallel(output_layouts=rows, use_local_output=False),
                "w_up": ColwiseParallel(),
                "w_down": RowwiseParallel(output_layouts=rows, use_local_output=False)}
        if hasattr(block, "w_gate"):
            plan["w_gate"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)
        block.attn_norm.register_forward_hook(_gather_norm_output)
        block.mlp_norm.register_forward_hook(_gather_norm_output)
        block.num_heads //= tp
        block.num_kv_heads //= tp
    head_output = Shard(-1) if vocab_parallel else Replicate()
    plan = {"embedding": RowwiseParallel(input_layouts=Replicate()), "final_norm": SequenceParallel(sequence_dim=0)}
    if model.head is not None:
        plan["head"] = ColwiseParallel(output_layouts=head_output, use_local_output=not vocab_parallel)
    # a tied head is the embedding, whose rows (the vocabulary) are already split: its logits come
    # out split over the vocabulary, as the untied head's do with ``vocab_parallel``
    parallelize_module(model, tp_mesh, plan)
    model.final_norm.register_forward_hook(_gather_norm_output)
    return model


class _Regather:
    """A norm's all-gathered output as autograd keeps it: its sequence shard only (``shard``), gathered
    again when backward first needs it (``full``, then shared by the projections that saved it)."""

    __slots__ = ("shard", "full")

    def __init__(self, shard: torch.Tensor) -> None:
        self.shard, self.full = shard, None


def _gather_norm_output(_module: Any, _inputs: Any, shard: torch.Tensor) -> torch.Tensor:
    """Forward hook of a sequence-parallel norm: its output (this rank's rows) all-gathered once into
    one replicated DTensor that the column-wise projections reading it share, so their input
    gradients add up as one partial sum, reduce-scattered once in backward (Megatron's fused QKV and
    gate/up). Tagged for ``regather_hooks``."""
    from torch.distributed.tensor import Replicate

    gathered = shard.redistribute(placements=[Replicate()])
    gathered._slimpack_regather = _Regather(shard)
    return gathered


def regather_hooks(pack: Callable[[torch.Tensor], Any],
                   unpack: Callable[[Any], torch.Tensor]) -> tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]:
    """Saved-tensor hooks (around ``pack``/``unpack``, e.g. the memory tracker's) that save a gathered
    norm output as its shard and all-gather it again in backward, as Megatron's sequence parallelism
    does for the QKV and MLP inputs: 1/tp of their memory for one more all-gather per block."""

    def pack_tagged(tensor: torch.Tensor) -> Any:
        regather = getattr(tensor, "_slimpack_regather", None)
        return pack(tensor) if regather is None else (regather, pack(regather.shard))

    def unpack_tagged(saved: Any) -> torch.Tensor:
        if not (isinstance(saved, tuple) and isinstance(saved[0], _Regather)):
            return unpack(saved)
        regather, packed = saved
        if regather.full is None:
            from torch.distributed.tensor import Replicate

            regather.full = unpack(packed).redistribute(placements=[Replicate()])
        return regather.full

    return pack_tagged, unpack_tagged


def is_sequence_parallel(stage: Any) -> bool:
    """Whether ``stage``'s layers run tensor- and sequence-parallel (their norm gains are DTensors;
    transformers' layers, which have no ``attn_norm``, never do)."""
    from torch.distributed.tensor import DTensor

    norm = getattr(stage.layers[0], "attn_norm", None) if len(stage.layers) else None
    return norm is not None and isinstance(norm.weight, DTensor)


def shard_sequence(x_te: torch.Tensor, stage: Any) -> torch.Tensor:
    """A chunk's layer input, replicated over tp (a plain tensor), as this rank's rows of a DTensor
    sharded over the sequence (``torch.chunk``'s split of the rows; no communication; backward: the
    gradient all-gathered). ``x_te`` itself when ``stage``'s layers are not tensor-parallel."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not is_sequence_parallel(stage):
        return x_te
    mesh = stage.layers[0].attn_norm.weight.device_mesh
    return DTensor.from_local(x_te, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(0)])


def gather_sequence(x_te: torch.Tensor) -> torch.Tensor:
    """Inverse of ``shard_sequence``: the whole chunk output on every tp rank (all-gathered; backward:
    this rank's rows of the replicated gradient, no communication)."""
    from torch.distributed.tensor import DTensor

    return x_te.full_tensor() if isinstance(x_te, DTensor) else x_te


@contextlib.contextmanager
def loss_context(tp: int) -> Iterator[None]:
    """torch's ``loss_parallel`` for ``tp`` > 1: the cross-entropy of vocabulary-sharded logits,
    forward and backward (a step's backward runs long after its forward, so the whole step runs
    inside). Plain tensors (gathered logits) are not affected by it."""
    if tp == 1:
        yield
        return
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        yield


def reduce_partial_gradients(params: Iterable[torch.Tensor]) -> None:
    """Sum the norm gains' gradients over the tp ranks, once per step: under sequence parallelism each
    rank's gradient of a replicated gain covers its own rows only (a ``Partial`` DTensor), as
    Megatron's all-reduce of sequence-parallel layer-norm gradients."""
    from torch.distributed.tensor import DTensor, Replicate

    for p in params:
        if isinstance(p.grad, DTensor) and any(placement.is_partial() for placement in p.grad.placements):
            p.grad = p.grad.redistribute(placements=[Replicate()])


def like_parameter(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A replicated ``grad`` of a split ``param`` cut to this rank's shard, which needs no
    communication; any other ``grad`` as it is (a partial sum waits for ``reduce_partial_gradients``,
    once per step, not once per backward)."""
    from torch.distributed.tensor import DTensor

    if (isinstance(grad, DTensor) and isinstance(param, DTensor) and grad.placements != param.placements
            and all(placement.is_replicate() for placement in grad.placements)):
        return grad.redistribute(placements=param.placements)
    return grad


def keep_gradients_sharded(params: Iterable[torch.nn.Parameter]) -> None:
    """Store each split parameter's gradient as its own split (``like_parameter``) as soon as
    autograd has accumulated it: the vocabulary-split embedding's backward yields the whole table's
    gradient on every rank, which would otherwise stay (tp - 1)/tp of the embedding larger than the
    rank's share of the model states that the memory model counts. Replicated parameters get no
    hook (it would run at every accumulation and do nothing)."""
    from torch.distributed.tensor import DTensor

    for param in params:
        if isinstance(param, DTensor) and not all(placement.is_replicate() for placement in param.placements):
            param.register_post_accumulate_grad_hook(_to_own_layout)


def _to_own_layout(param: torch.Tensor) -> None:
    assert param.grad is not None
    param.grad = like_parameter(param.grad, param)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing into it writes the DTensor), else the tensor."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (all-gathered over the mesh when it is a sharded DTensor)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
