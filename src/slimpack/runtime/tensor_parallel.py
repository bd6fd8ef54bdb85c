"""Tensor parallelism of the runtime's model through torch's DTensor API (Megatron's layer split).

``parallelize_model`` hands the model's modules to ``torch.distributed.tensor.parallel.
parallelize_module`` over the tensor-parallel sub-mesh:

- attention: Q, K, V projections column-wise (each rank gets whole heads: rows of ``wq``/``wk``/
  ``wv`` are head-major, so rank t holds query heads [t·H/tp, (t+1)·H/tp) and KV heads
  [t·K/tp, (t+1)·K/tp), which are exactly the KV heads its query heads read under GQA); the output
  projection row-wise, whose partial sums are all-reduced;
- MLP: gate and up column-wise, down row-wise (one all-reduce);
- embedding: vocabulary rows split (row-wise; the partial lookups are all-reduced);
- LM head: vocabulary columns split. ``vocab_parallel=True`` keeps the logits sharded over the
  vocabulary and computes the cross-entropy with torch's ``loss_parallel`` (a max and a sum-exp
  all-reduce per token instead of gathering T x V logits); ``False`` all-gathers the logits.

The attention itself runs on local heads with plain tensors: the column-wise projections hand back
local tensors (``use_local_output``), so ``varlen_attention``, its K/V prefixes and the executor's
cells work unchanged on H/tp query and K/tp KV heads (``Block.num_heads``/``num_kv_heads`` become
the per-rank counts). Norm gains stay replicated, ordinary tensors; their gradients are identical on
every tensor-parallel rank because their inputs and output gradients are (the column-wise layers'
backward all-reduces the input gradient).

Collectives per layer, forward: 2 all-reduces of the (T, E) activation (after ``wo`` and after
``w_down``); backward: 2 more (the input gradients of the Q/K/V and gate/up projections). That is
Megatron's count without sequence parallelism (Shoeybi et al. 2019, §3), i.e. 4 ring reduce-scatter
+ all-gather pairs per layer — ``cost.model.TP_COLLECTIVES_FORWARD`` counts each all-reduce as a
reduce-scatter plus an all-gather over forward and backward together.

Sequence parallelism (norms on T/tp rows) is not applied: the executor's groups and cells have token
counts that need not divide by tp, and DTensor's ``Shard`` on an uneven dimension needs explicit
global shapes at every boundary. The activations between layers are therefore replicated over tp.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from slimpack.config import ModelConfig
from slimpack.runtime.model import Transformer


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    """``ValueError`` unless the model splits into ``tp`` equal shards of whole heads."""
    for what, count in (("attention heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads),
                        ("MLP width", cfg.ffn_hidden), ("vocabulary", cfg.vocab_size)):
        if count % tp:
            raise ValueError(f"tp={tp} does not divide the model's {what} ({count})")
    if cfg.tie_embeddings and tp > 1:
        raise ValueError("tensor parallelism with tied embeddings is not supported (the head would be "
                         "the vocabulary-split embedding)")


def parallelize_model(model: Transformer, tp_mesh: Any, *, vocab_parallel: bool = True) -> Transformer:
    """Shard ``model``'s layers, embedding and head over ``tp_mesh`` (a 1-D ``DeviceMesh``), in place.

    Every rank must hold the same full weights before the call (the runtime builds them from one
    seed); each keeps its shards.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    check_tensor_parallel(model.config, tp)
    if tp == 1:
        return model
    for block in model.layers:
        # the norms' outputs become one replicated DTensor each, shared by the column-wise layers
        # that read them: their input gradients then add up as one partial sum, all-reduced once
        # (Megatron's fused QKV), not once per projection
        replicated = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate(),
                                         use_local_output=False)
        plan = {"attn_norm": replicated, "mlp_norm": replicated,
                "wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
                "wo": RowwiseParallel(), "w_up": ColwiseParallel(), "w_down": RowwiseParallel()}
        if hasattr(block, "w_gate"):
            plan["w_gate"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)
        block.num_heads //= tp
        block.num_kv_heads //= tp
    head_output = Shard(-1) if vocab_parallel else Replicate()
    parallelize_module(model, tp_mesh, {
        "embedding": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=head_output, use_local_output=not vocab_parallel)})
    return model


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


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing into it writes the DTensor), else the tensor."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (all-gathered over the mesh when it is a sharded DTensor)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
