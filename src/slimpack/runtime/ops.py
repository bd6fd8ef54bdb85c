"""Custom autograd functions for the row-wise parts of a layer, written to keep for backward exactly
what the memory model (``slimpack.cost.memory``) counts and nothing more.

Plain torch would keep extra tensors: ``x * rsqrt(mean(x²)) * w`` keeps both x and the normalised x;
``silu(g) * u`` keeps g, silu(g) and u; RoPE as ``x*cos + rot(x)*sin`` keeps the position tables per
call. Here RMSNorm keeps its input (plus one scale per token), the SiLU gate keeps g and u, and RoPE
keeps only the cos/sin tables, which all layers of a stage share.

The reference computation (``slimpack.runtime.reference``) uses the plain formulas instead, so the
gradient tests check these backward formulas too.
"""

from __future__ import annotations

from typing import Any

import torch

ROPE_THETA = 10000.0
"""RoPE base (Su et al., 2021; Llama 2). The numerics do not depend on the value."""
RMS_NORM_EPS = 1e-5


def rope_tables(positions_t: torch.Tensor, head_dim: int, *, dtype: torch.dtype,
                theta: float = ROPE_THETA) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (T, D/2), for the given per-token positions (computed in float64)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions_t.device) / head_dim)
    angles = positions_t.to(torch.float64).unsqueeze(1) * inv_freq.unsqueeze(0)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope_rotate(x_thd: torch.Tensor, cos_tc: torch.Tensor, sin_tc: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on (T, H, D): pairs (i, i + D/2) turn by the token's angle. No autograd."""
    half = x_thd.shape[-1] // 2
    x1, x2 = x_thd[..., :half], x_thd[..., half:]
    cos, sin = cos_tc.unsqueeze(1), sin_tc.unsqueeze(1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x_thd: torch.Tensor, cos_tc: torch.Tensor, sin_tc: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos_tc, sin_tc)
        return rope_rotate(x_thd, cos_tc, sin_tc)

    @staticmethod
    def backward(ctx: Any, dy_thd: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos_tc, sin_tc = ctx.saved_tensors
        # the rotation is orthogonal: its transpose turns by the opposite angle
        return rope_rotate(dy_thd, cos_tc, -sin_tc), None, None


def apply_rope(x_thd: torch.Tensor, cos_tc: torch.Tensor, sin_tc: torch.Tensor) -> torch.Tensor:
    return _RoPE.apply(x_thd, cos_tc, sin_tc)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x_te: torch.Tensor, weight_e: torch.Tensor, eps: float) -> torch.Tensor:
        rstd_t1 = torch.rsqrt(x_te.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x_te, rstd_t1, weight_e)
        return x_te * rstd_t1 * weight_e

    @staticmethod
    def backward(ctx: Any, dy_te: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x_te, rstd_t1, weight_e = ctx.saved_tensors
        normed_te = x_te * rstd_t1
        dweight_e = (dy_te * normed_te).sum(0)
        dnormed_te = dy_te * weight_e
        # d/dx of x·r with r = mean(x²)^-1/2:  r·(dn − n·mean(dn·n))
        dx_te = rstd_t1 * (dnormed_te - normed_te * (dnormed_te * normed_te).mean(-1, keepdim=True))
        return dx_te, dweight_e, None


def rms_norm(x_te: torch.Tensor, weight_e: torch.Tensor, eps: float = RMS_NORM_EPS) -> torch.Tensor:
    return _RMSNorm.apply(x_te, weight_e, eps)


class _SiluGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate_tf: torch.Tensor, up_tf: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate_tf, up_tf)
        return torch.nn.functional.silu(gate_tf) * up_tf

    @staticmethod
    def backward(ctx: Any, dy_tf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate_tf, up_tf = ctx.saved_tensors
        sig = torch.sigmoid(gate_tf)
        silu = gate_tf * sig
        # silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
        return dy_tf * up_tf * sig * (1 + gate_tf * (1 - sig)), dy_tf * silu


def silu_gate(gate_tf: torch.Tensor, up_tf: torch.Tensor) -> torch.Tensor:
    """SwiGLU's inner product silu(gate) * up, keeping gate and up for backward."""
    return _SiluGate.apply(gate_tf, up_tf)
