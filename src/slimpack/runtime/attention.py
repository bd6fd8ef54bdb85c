"""Sliced variable-length causal attention: one function, several backends.

``varlen_attention`` runs N packed segments in one call. Segment i has its own queries, keys and
values (rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` of ``q`` and ``cu_seqlens_k[i]:cu_seqlens_k[i+1]``
of ``k``/``v``) and, optionally, a *prefix*: K/V pieces of the same sample's earlier slices, kept
from their forward (DESIGN.md §3: a slice [a, b) attends to keys [0, b) of its sample). The keys of
segment i are ``prefix pieces ++ own keys``; the mask is causal and aligned at the bottom right, so
the last query sees every key and query t (of n_q) sees keys ≤ t + n_k − n_q — the convention of
FlashAttention ≥ 2.1 (``flash_attn_varlen_func(causal=True)`` docstring) and of torch's
``varlen_attn(window_size=(-1, 0))``. Segments never see each other.

Prefix pieces are ordinary autograd inputs: the backward returns their dK/dV, which is how a later
slice's backward hands its contribution to an earlier slice (see ``executor``). Nothing is copied
into the saved state: the function saves own q, k, v, the output and the log-sum-exp (like
FlashAttention) plus references to the prefix pieces, and recomputes the scores in backward.

Backends (``backend=``), all with the same results (see ``kernels``):
- ``flash``: flash-attn's varlen forward and backward kernels (CUDA, fp16/bf16, flash-attn >= 2.6);
- ``torch``: torch's own varlen flash-attention ops (CUDA, fp16/bf16), when this torch has them;
- ``cpu``: torch's fused CPU flash-attention kernels, two calls per segment (CPU);
- ``math``: blockwise softmax attention in plain torch, any device and dtype (the definition);
- ``auto``: the first of flash, torch, cpu, math that supports the device and dtype; on CUDA it
  refuses to fall back to ``math`` (float32, or no fused kernel installed): ask for it by name.
Every backend's forward returns the log-sum-exp and its backward kernel uses it: nothing is
recomputed but the scores inside the backward kernel, as in FlashAttention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from slimpack.runtime.kernels import KERNELS, has_cpu_flash, has_flash, has_torch_varlen

Backend = Literal["auto", "math", "cpu", "flash", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "flash", "torch", "cpu", "math")
KVPiece = tuple[torch.Tensor, torch.Tensor]


def available_backends(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[str]:
    """Backends that can run on ``device`` with ``dtype``, in the order ``auto`` tries them."""
    device = torch.device(device)
    found = []
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        if has_flash():
            found.append("flash")
        if has_torch_varlen():
            found.append("torch")
    if device.type == "cpu" and dtype in (torch.float32, torch.float64, torch.bfloat16) and has_cpu_flash():
        found.append("cpu")
    found.append("math")
    return found


def resolve_backend(backend: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The concrete backend for ``backend`` on ``device``/``dtype``; ``ValueError`` if unusable."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; valid: {', '.join(BACKENDS)}")
    usable = available_backends(device, dtype)
    if backend == "auto" and torch.device(device).type == "cuda" and usable == ["math"]:
        # the math kernel is written for correctness: on a GPU it would silently cost several times
        # the fused kernels' time and far more memory
        why = ("no fused GPU kernel is installed (flash-attn >= 2.6, or a torch with torch.nn.attention.varlen)"
               if dtype in (torch.float16, torch.bfloat16) else f"the fused GPU kernels need bf16/fp16, not {dtype}")
        raise ValueError(f"{why}; only the slow math kernel could run: use bfloat16, or ask for "
                         f"the math backend explicitly")
    if backend == "auto":
        return usable[0]
    if backend not in usable:
        raise ValueError(f"attention backend {backend!r} cannot run on {torch.device(device)} with {dtype} "
                         f"(usable here: {', '.join(usable)})")
    return backend


# ---- the autograd function ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Layout:
    backend: str
    cu_q: list[int]
    cu_k: list[int]
    """Own keys of each segment, in the packed ``k``."""
    pieces: tuple[int, ...]
    """Number of prefix pieces of each segment."""
    scale: float

    def full_keys(self, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                  flat: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Packed keys with each segment's prefix in front of its own keys (no copy without prefix)."""
        if not any(self.pieces):
            return k_tkd, v_tkd, self.cu_k
        ks, vs, cu_full, at = [], [], [0], 0
        for i, count in enumerate(self.pieces):
            seg_k = [flat[2 * (at + j)] for j in range(count)] + [k_tkd[self.cu_k[i]:self.cu_k[i + 1]]]
            seg_v = [flat[2 * (at + j) + 1] for j in range(count)] + [v_tkd[self.cu_k[i]:self.cu_k[i + 1]]]
            at += count
            ks.extend(seg_k)
            vs.extend(seg_v)
            cu_full.append(cu_full[-1] + sum(t.shape[0] for t in seg_k))
        return torch.cat(ks), torch.cat(vs), cu_full

    def split_key_grads(self, dk_full: torch.Tensor, dv_full: torch.Tensor, cu_full: list[int],
                        flat: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Inverse of ``full_keys`` for gradients: (dk own, dv own, flat piece grads)."""
        if not any(self.pieces):
            return dk_full, dv_full, []
        dk_own, dv_own, piece_grads, at = [], [], [], 0
        for i, count in enumerate(self.pieces):
            row = cu_full[i]
            for j in range(count):
                n = flat[2 * (at + j)].shape[0]
                piece_grads.extend([dk_full[row:row + n], dv_full[row:row + n]])
                row += n
            at += count
            dk_own.append(dk_full[row:cu_full[i + 1]])
            dv_own.append(dv_full[row:cu_full[i + 1]])
        return torch.cat(dk_own), torch.cat(dv_own), piece_grads


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, layout: _Layout, q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                *flat: torch.Tensor) -> torch.Tensor:
        kf_tkd, vf_tkd, cu_full = layout.full_keys(k_tkd, v_tkd, flat)
        out_thd, lse = KERNELS[layout.backend][0](q_thd, kf_tkd, vf_tkd, layout.cu_q, cu_full, layout.scale)
        ctx.save_for_backward(q_thd, k_tkd, v_tkd, out_thd, lse, *flat)
        ctx.layout = layout
        return out_thd

    @staticmethod
    def backward(ctx: Any, dout_thd: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        layout: _Layout = ctx.layout
        q_thd, k_tkd, v_tkd, out_thd, lse, *flat = ctx.saved_tensors
        kf_tkd, vf_tkd, cu_full = layout.full_keys(k_tkd, v_tkd, flat)
        dq, dk_full, dv_full = KERNELS[layout.backend][1](dout_thd.contiguous(), q_thd, kf_tkd, vf_tkd, out_thd,
                                                          lse, layout.cu_q, cu_full, layout.scale)
        dk, dv, piece_grads = layout.split_key_grads(dk_full, dv_full, cu_full, flat)
        return (None, dq, dk, dv, *piece_grads)


def _offsets(cu: Sequence[int] | torch.Tensor, name: str) -> list[int]:
    values = [int(x) for x in (cu.tolist() if isinstance(cu, torch.Tensor) else cu)]
    if len(values) < 2 or values[0] != 0 or any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must start at 0 and not decrease, got {values[:8]}")
    return values


def varlen_attention(q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                     cu_seqlens_q: Sequence[int] | torch.Tensor,
                     cu_seqlens_k: Sequence[int] | torch.Tensor | None = None, *,
                     prefix: Sequence[Sequence[KVPiece]] | None = None, backend: str = "auto",
                     scale: float | None = None) -> torch.Tensor:
    """Causal attention of N packed segments, each optionally after a K/V prefix.

    q_thd: (T_q, H, D); k_tkd, v_tkd: (T_k, K, D) own keys/values, H a multiple of K (GQA: query
    head h reads KV head h // (H/K)). ``cu_seqlens_q``/``cu_seqlens_k``: N+1 offsets into the packed
    rows (``cu_seqlens_k`` defaults to ``cu_seqlens_q``). ``prefix[i]``: (k, v) pieces, each (n, K, D),
    placed in order before segment i's own keys. Per segment the key count (prefix + own) must be at
    least the query count; the mask is causal, bottom-right aligned. Returns (T_q, H, D); gradients
    reach q, k, v and every prefix piece. ``scale`` defaults to 1/sqrt(D).
    """
    if q_thd.dim() != 3 or k_tkd.dim() != 3 or v_tkd.shape != k_tkd.shape:
        raise ValueError(f"expected q (T, H, D) and k, v (T, K, D), got {tuple(q_thd.shape)}, "
                         f"{tuple(k_tkd.shape)}, {tuple(v_tkd.shape)}")
    if q_thd.shape[2] != k_tkd.shape[2] or q_thd.shape[1] % k_tkd.shape[1]:
        raise ValueError(f"query heads {q_thd.shape[1]} must be a multiple of KV heads {k_tkd.shape[1]} "
                         f"with equal head dim ({q_thd.shape[2]} vs {k_tkd.shape[2]})")
    cu_q = _offsets(cu_seqlens_q, "cu_seqlens_q")
    cu_k = cu_q if cu_seqlens_k is None else _offsets(cu_seqlens_k, "cu_seqlens_k")
    if len(cu_k) != len(cu_q) or cu_q[-1] != q_thd.shape[0] or cu_k[-1] != k_tkd.shape[0]:
        raise ValueError(f"offsets do not match the tensors: {len(cu_q) - 1} query segments over "
                         f"{cu_q[-1]}/{q_thd.shape[0]} rows, {len(cu_k) - 1} key segments over "
                         f"{cu_k[-1]}/{k_tkd.shape[0]} rows")
    prefix = prefix or [()] * (len(cu_q) - 1)
    if len(prefix) != len(cu_q) - 1:
        raise ValueError(f"prefix has {len(prefix)} entries for {len(cu_q) - 1} segments")
    flat: list[torch.Tensor] = []
    for i, pieces in enumerate(prefix):
        before = sum(pk.shape[0] for pk, _ in pieces)
        if before + cu_k[i + 1] - cu_k[i] < cu_q[i + 1] - cu_q[i]:
            raise ValueError(f"segment {i}: {cu_q[i + 1] - cu_q[i]} queries but only "
                             f"{before + cu_k[i + 1] - cu_k[i]} keys")
        for pk, pv in pieces:
            if pk.shape[1:] != k_tkd.shape[1:] or pv.shape != pk.shape:
                raise ValueError(f"segment {i}: prefix piece of shape {tuple(pk.shape)}/{tuple(pv.shape)} "
                                 f"does not match keys (n, {k_tkd.shape[1]}, {k_tkd.shape[2]})")
            flat.extend((pk, pv))
    layout = _Layout(backend=resolve_backend(backend, q_thd.device, q_thd.dtype), cu_q=cu_q, cu_k=cu_k,
                     pieces=tuple(len(p) for p in prefix),
                     scale=scale if scale is not None else 1.0 / math.sqrt(q_thd.shape[2]))
    return _VarlenAttention.apply(layout, q_thd, k_tkd, v_tkd, *flat)
