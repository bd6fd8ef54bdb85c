"""Tensor parallelism of transformers' decoder models (``hf_model``) through torch's DTensor API: the
Megatron split ``tensor_parallel`` applies to the home-made model, on the Hugging Face module names.

``parallelize_hf_model`` hands each decoder layer to ``parallelize_module`` over the tp sub-mesh:

- ``self_attn.q_proj``/``k_proj``/``v_proj`` column-wise: rows of the weights are head-major, so
  rank t holds query heads [t·H/tp, (t+1)·H/tp) and KV heads [t·K/tp, (t+1)·K/tp), the KV heads its
  query heads read under GQA (Qwen2's biases are split with them). The column-wise layers hand back
  local tensors, and transformers' attention reshapes them with ``-1`` heads
  (``view(*input_shape, -1, head_dim)``) and flattens the output with ``reshape(*input_shape, -1)``,
  so the layer's own code, its RoPE and the executor's ``attend`` see the rank's H/tp and K/tp
  heads as plain tensors; ``o_proj`` row-wise (its partial sums all-reduced);
- ``mlp.gate_proj``/``up_proj`` column-wise, ``mlp.down_proj`` row-wise (one all-reduce);
- ``input_layernorm``/``post_attention_layernorm`` stay replicated; their outputs become one
  replicated DTensor each, shared by the column-wise projections that read them, so the
  projections' input gradients add up as one partial sum, all-reduced once (as the home-made
  model's norms; Megatron's fused QKV);
- Qwen3's per-head ``q_norm``/``k_norm`` stay replicated plain tensors, but each rank normalises
  only its own heads, so the gradient of their gains is a partial sum over heads: a hook on each
  gain all-reduces it over tp (head_dim elements per layer and cell, in backward);
- ``embed_tokens``: vocabulary rows split (row-wise; the partial lookups all-reduced); ``lm_head``:
  vocabulary columns split, the logits left sharded for ``tensor_parallel.loss_context``'s
  vocabulary-parallel cross-entropy (``vocab_parallel=True``, as the home-made model, measured
  faster and smaller in docs/runtime.md) or all-gathered. A tied ``lm_head`` is re-tied to the split
  embedding (its output columns are the embedding's rows), with only its input and output laid out.

Collectives per layer and cell: forward 2 all-reduces of the (T, E) activation (after ``o_proj``
and ``down_proj``), backward 2 (the norms' output gradients). No sequence parallelism: the norms and
the residual stream run on all T rows of every tp rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from slimpack.runtime.tensor_parallel import check_tensor_parallel

if TYPE_CHECKING:
    from slimpack.runtime.hf_model import HFModel

COLUMN_WISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_WISE = ("self_attn.o_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
HEAD_NORMS = ("q_norm", "k_norm")
"""Qwen3's per-head norms of Q and K (inside ``self_attn``)."""


def parallelize_hf_model(model: HFModel, tp_mesh: Any, *, vocab_parallel: bool = True) -> HFModel:
    """Shard ``model``'s decoder layers, embedding and LM head over ``tp_mesh`` (a 1-D
    ``DeviceMesh``), in place. Every rank must hold the same full weights before the call (built
    from one seed or one checkpoint); each keeps its shards."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
        RowwiseParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    check_tensor_parallel(model.config, tp)
    if tp == 1:
        return model
    replicated = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Replicate(),
                                     use_local_output=False)
    plan: dict[str, Any] = {name: ColwiseParallel() for name in COLUMN_WISE}
    plan |= {name: RowwiseParallel() for name in ROW_WISE}
    plan |= {name: replicated for name in NORMS}
    group = tp_mesh.get_group()
    for layer in model.hf.model.layers:
        parallelize_module(layer, tp_mesh, plan)
        for name in HEAD_NORMS:
            norm = getattr(layer.self_attn, name, None)
            if norm is not None:
                norm.weight.register_hook(lambda grad: _summed(grad, group))
    logits = Shard(-1) if vocab_parallel else Replicate()
    if not model.config.tie_embeddings:
        parallelize_module(model.hf, tp_mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=logits, use_local_output=not vocab_parallel)})
        return model
    # a tied head is the embedding: split once (by vocabulary rows, which are the head's output
    # columns), the head re-tied to the split tensor and only its input and output laid out
    parallelize_module(model.hf, tp_mesh, {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate())})
    model.hf.lm_head.weight = model.hf.model.embed_tokens.weight
    parallelize_module(model.hf, tp_mesh, {"lm_head": PrepareModuleInputOutput(
        input_layouts=Replicate(), desired_input_layouts=Replicate(), use_local_input=False,
        output_layouts=Shard(-1), desired_output_layouts=logits, use_local_output=not vocab_parallel)})
    return model


def _summed(grad: torch.Tensor, group: Any) -> torch.Tensor:
    """``grad`` summed over ``group`` (a new tensor: autograd may still hold the one it passed)."""
    total = grad.clone()
    dist.all_reduce(total, group=group)
    return total
