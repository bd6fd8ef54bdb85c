"""Context parallelism: the K/V exchange of a cell's attention over its pipeline's cp group.

Each cp rank holds its zigzag share of every slice (``cells.zigzag``) and computes the row-wise
parts of the layer (norms, projections, MLP, head) on those rows only. Attention needs, for each of
its query rows, the keys of all earlier positions of the sample, most of which other ranks hold.
``gather_rows`` all-gathers the cell's K and V (this rank's KV heads, all cp ranks' rows, put back in
position order); each rank then runs its query pieces against the full keys, exactly like a slice
with a K/V prefix (``varlen_attention``), so the result is the unsharded attention. Its backward
reduce-scatters the K/V gradients: every rank's queries contribute to every key's gradient, and
each rank receives the sum for its own rows.

The gathered K/V are what the executor publishes for later slices of the same sample: a later cell
reads them as prefix pieces without any further communication, and the gradient it accumulates
into them flows back through the same reduce-scatter when the earlier cell runs its backward.

Why all-gather and not a ring with the log-sum-exp merge (``kernels``): per layer both move the same
bytes forward ((cp−1)/cp of the cell's K/V per rank), but the gather is one collective instead of
cp−1 dependent steps, and the gathered K/V serve the cell's later slices and zigzag pieces without
re-sending. Its price is memory: a rank keeps the cell's full K/V (2·kv_hidden/tp per token per
layer, small under GQA) instead of 1/cp of it. Its backward is one reduce-scatter of dK/dV, where a
ring sends K/V and dK/dV around again (twice the bytes). The same choice as Llama 3's context
parallelism (Dubey et al. 2024, §3.3.2). ``CostModel.layer_collectives`` and
``cost.memory.gathered_kv_bytes_per_token`` charge exactly this (tests/runtime/test_comm_accounting.py).
"""

from __future__ import annotations

from typing import Any

import torch


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x_local: torch.Tensor, index: torch.Tensor, width: int, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        size = dist.get_world_size(group)
        padded = x_local.new_zeros((width, *x_local.shape[1:]))
        padded[:x_local.shape[0]] = x_local
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded, group=group)
        ctx.index, ctx.rows, ctx.width, ctx.group, ctx.size = index, x_local.shape[0], width, group, size
        return torch.cat(parts).index_select(0, index)

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        import torch.distributed as dist

        stacked = grad_full.new_zeros((ctx.size * ctx.width, *grad_full.shape[1:]))
        stacked.index_copy_(0, ctx.index, grad_full.contiguous())
        mine = grad_full.new_empty((ctx.width, *grad_full.shape[1:]))
        dist.reduce_scatter(mine, list(stacked.chunk(ctx.size)), group=ctx.group)
        return mine[:ctx.rows], None, None, None


def gather_rows(x_local: torch.Tensor, index: torch.Tensor, width: int, group: Any) -> torch.Tensor:
    """All cp ranks' rows of a cell in position order: rank r's ``x_local`` (at most ``width`` rows)
    is padded to ``width``, the ranks' blocks are concatenated in rank order and row i of the result
    is row ``index[i]`` of that concatenation (``GroupLayout.gather_order``). Backward: reduce-scatter."""
    return _GatherRows.apply(x_local, index, width, group)
