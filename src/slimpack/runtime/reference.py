"""The ordinary computation the executor must reproduce: each sample alone, unsliced and unpacked,
full causal attention, plain torch formulas and torch's own autograd (no custom functions).

Shares only the parameters with the executor path: the norms, RoPE, SwiGLU and attention are
written again here from their definitions (attention by ``torch.nn.functional.
scaled_dot_product_attention``), so a matching gradient checks the executor's backward formulas too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from slimpack.runtime.loss import count_loss_tokens
from slimpack.runtime.model import Block, Transformer
from slimpack.runtime.ops import RMS_NORM_EPS, rope_tables


def _rms_norm(x_te: torch.Tensor, weight_e: torch.Tensor) -> torch.Tensor:
    return x_te * torch.rsqrt(x_te.pow(2).mean(-1, keepdim=True) + RMS_NORM_EPS) * weight_e


def _rope(x_thd: torch.Tensor, cos_tc: torch.Tensor, sin_tc: torch.Tensor) -> torch.Tensor:
    half = x_thd.shape[-1] // 2
    cos = torch.cat((cos_tc, cos_tc), dim=-1).unsqueeze(1)
    sin = torch.cat((sin_tc, sin_tc), dim=-1).unsqueeze(1)
    rotated = torch.cat((-x_thd[..., half:], x_thd[..., :half]), dim=-1)
    return x_thd * cos + rotated * sin


def _layer(block: Block, x_te: torch.Tensor, cos_tc: torch.Tensor, sin_tc: torch.Tensor) -> torch.Tensor:
    cfg = block.config
    num_tokens = x_te.shape[0]
    a_te = _rms_norm(x_te, block.attn_norm.weight)
    q_thd = _rope((a_te @ block.wq.weight.T).view(num_tokens, cfg.num_heads, cfg.head_dim), cos_tc, sin_tc)
    k_tkd = _rope((a_te @ block.wk.weight.T).view(num_tokens, cfg.num_kv_heads, cfg.head_dim), cos_tc, sin_tc)
    v_tkd = (a_te @ block.wv.weight.T).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    # (1, heads, T, D): with a batch dimension torch picks its fused kernel (memory O(T), not O(T²))
    attn_1hte = F.scaled_dot_product_attention(
        q_thd.transpose(0, 1)[None], k_tkd.transpose(0, 1)[None], v_tkd.transpose(0, 1)[None], is_causal=True,
        enable_gqa=cfg.num_heads != cfg.num_kv_heads, scale=1.0 / math.sqrt(cfg.head_dim))
    h1_te = x_te + attn_1hte[0].transpose(0, 1).reshape(num_tokens, cfg.hidden) @ block.wo.weight.T
    b_te = _rms_norm(h1_te, block.mlp_norm.weight)
    if cfg.ffn_kind == "swiglu":
        inner_tf = F.silu(b_te @ block.w_gate.weight.T) * (b_te @ block.w_up.weight.T)
    else:
        inner_tf = F.gelu(b_te @ block.w_up.weight.T)
    return h1_te + inner_tf @ block.w_down.weight.T


def sample_token_losses(model: Transformer, tokens_l: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of positions 0..L−2 of one sample (L−1 values), with autograd."""
    cfg = model.config
    dtype = model.embedding.weight.dtype
    cos_tc, sin_tc = rope_tables(torch.arange(tokens_l.shape[0], device=tokens_l.device), cfg.head_dim,
                                 dtype=dtype)
    x_te = model.embedding.weight[tokens_l]
    for block in model.layers:
        x_te = _layer(block, x_te, cos_tc, sin_tc)
    logits_tv = _rms_norm(x_te, model.final_norm.weight) @ model.head_weight.T
    return F.cross_entropy(logits_tv[:-1], tokens_l[1:], reduction="none")


def reference_loss(model: Transformer, tokens: Mapping[int, torch.Tensor], *, num_loss_tokens: int | None = None,
                   backward: bool = True) -> torch.Tensor:
    """Σ over samples of their token cross-entropies / ``num_loss_tokens`` (default: these samples').

    With ``backward`` the gradients accumulate in the parameters' ``.grad``, sample by sample (so
    only one sample's graph is alive at a time); the returned loss is detached.
    """
    n = num_loss_tokens if num_loss_tokens is not None else count_loss_tokens(t.shape[0] for t in tokens.values())
    total = torch.zeros((), dtype=model.embedding.weight.dtype, device=model.embedding.weight.device)
    for sample_id in sorted(tokens):
        ids = tokens[sample_id]
        if ids.shape[0] < 2:
            continue  # no loss token
        loss = sample_token_losses(model, ids).sum() / max(n, 1)
        if backward:
            loss.backward()
            loss = loss.detach()
        total = total + loss
    return total
