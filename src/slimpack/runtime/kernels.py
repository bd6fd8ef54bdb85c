"""Attention kernels behind ``varlen_attention``: each runs packed segments whose keys are already
laid out in full (prefix pieces in front of the own keys), causal with bottom-right alignment.

A kernel pair is ``forward(q, k, v, cu_q, cu_k, scale) -> (out, lse)`` and
``backward(dout, q, k, v, out, lse, cu_q, cu_k, scale) -> (dq, dk, dv)``; the backward recomputes the
scores from q, k and the log-sum-exp (FlashAttention's scheme), nothing else is kept. The LSE's
layout is the kernel's own ((T, H) for ``math``/``cpu``, the library's for the GPU kernels).

- ``math``: blockwise softmax in plain torch (any device and dtype), written from the definition;
  score blocks hold at most ``MATH_BLOCK_ELEMENTS`` elements.
- ``cpu``: torch's fused CPU flash-attention kernels (``aten::_scaled_dot_product_flash_attention_
  for_cpu`` and its backward; about ten times faster than ``math``). They only know top-left causal
  masks, so each segment is split: its queries against the prefix keys [0, n_k − n_q) (all visible,
  no mask) and against its last n_q keys (a square, causal). The two partial results are merged by
  their log-sum-exps; the backward of each part, given the merged output and log-sum-exp, yields
  exactly that part's share of the gradients (the same identity ring attention relies on).
- ``flash``: flash-attn's varlen forward (which returns the LSE) and its varlen backward kernel.
- ``torch``: torch's own varlen flash-attention ops (``torch.nn.attention.varlen``), forward and
  backward, the fallback where flash-attn is not installed.

Shape suffixes: T tokens, H query heads, K KV heads, D head dim, N keys.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch

# Score-block budget of the math kernel: elements of one (query block x keys) score matrix.
MATH_BLOCK_ELEMENTS = 1 << 22


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def torch_varlen() -> Any | None:
    """torch's ``varlen_attn`` where this torch has it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def has_cpu_flash() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def _bounds(cu: list[int]) -> list[tuple[int, int]]:
    return list(zip(cu[:-1], cu[1:], strict=True))


def math_forward(q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor, cu_q: list[int],
                  cu_k: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    num_heads, num_kv = q_thd.shape[1], k_tkd.shape[1]
    group = num_heads // num_kv
    out_thd = torch.empty_like(q_thd)
    # The log-sum-exp is float32 for half inputs (as in FlashAttention), else the input dtype.
    lse_dtype = torch.float32 if q_thd.element_size() < 4 else q_thd.dtype
    lse_th = torch.empty(q_thd.shape[:2], dtype=lse_dtype, device=q_thd.device)
    for (q0, q1), (k0, k1) in zip(_bounds(cu_q), _bounds(cu_k), strict=True):
        n_q, n_k = q1 - q0, k1 - k0
        if n_q == 0:
            continue
        # K heads x (group x queries) rows: query head h uses KV head h // group (flash's GQA rule)
        q_kgqd = q_thd[q0:q1].permute(1, 0, 2).reshape(num_kv, group, n_q, -1)
        k_kdn = k_tkd[k0:k1].permute(1, 2, 0)
        v_knd = v_tkd[k0:k1].permute(1, 0, 2)
        for b0, b1 in _query_blocks(n_q, n_k, num_heads):
            used = b1 + n_k - n_q  # keys visible to the block's last query
            scores = _masked_scores(q_kgqd[:, :, b0:b1], k_kdn[:, :, :used], b0, n_k - n_q, scale)
            lse = torch.logsumexp(scores.float() if lse_dtype != scores.dtype else scores, dim=-1)
            probs = torch.exp(scores - lse.to(scores.dtype).unsqueeze(-1))
            out = torch.einsum("kgqn,knd->kgqd", probs, v_knd[:, :used])
            out_thd[q0 + b0:q0 + b1] = out.reshape(num_heads, b1 - b0, -1).permute(1, 0, 2)
            lse_th[q0 + b0:q0 + b1] = lse.reshape(num_heads, b1 - b0).T
    return out_thd, lse_th


def math_backward(dout_thd: torch.Tensor, q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                   out_thd: torch.Tensor, lse_th: torch.Tensor, cu_q: list[int], cu_k: list[int],
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_heads, num_kv = q_thd.shape[1], k_tkd.shape[1]
    group = num_heads // num_kv
    dq_thd = torch.zeros_like(q_thd)
    dk_tkd = torch.zeros_like(k_tkd)
    dv_tkd = torch.zeros_like(v_tkd)
    # delta = rowsum(dO * O), the softmax-backward correction (FlashAttention-2, Alg. 2)
    delta_th = (dout_thd * out_thd).sum(-1)
    for (q0, q1), (k0, k1) in zip(_bounds(cu_q), _bounds(cu_k), strict=True):
        n_q, n_k = q1 - q0, k1 - k0
        if n_q == 0:
            continue
        q_kgqd = q_thd[q0:q1].permute(1, 0, 2).reshape(num_kv, group, n_q, -1)
        do_kgqd = dout_thd[q0:q1].permute(1, 0, 2).reshape(num_kv, group, n_q, -1)
        lse_kgq = lse_th[q0:q1].T.reshape(num_kv, group, n_q)
        delta_kgq = delta_th[q0:q1].T.reshape(num_kv, group, n_q)
        k_kdn = k_tkd[k0:k1].permute(1, 2, 0)
        v_knd = v_tkd[k0:k1].permute(1, 0, 2)
        for b0, b1 in _query_blocks(n_q, n_k, num_heads):
            used = b1 + n_k - n_q
            scores = _masked_scores(q_kgqd[:, :, b0:b1], k_kdn[:, :, :used], b0, n_k - n_q, scale)
            probs = torch.exp(scores - lse_kgq[:, :, b0:b1].to(scores.dtype).unsqueeze(-1))
            do = do_kgqd[:, :, b0:b1]
            dv_tkd[k0:k0 + used] += torch.einsum("kgqn,kgqd->nkd", probs, do)
            dprobs = torch.einsum("kgqd,knd->kgqn", do, v_knd[:, :used])
            dscores = probs * (dprobs - delta_kgq[:, :, b0:b1].to(probs.dtype).unsqueeze(-1)) * scale
            dq = torch.einsum("kgqn,kdn->kgqd", dscores, k_kdn[:, :, :used])
            dq_thd[q0 + b0:q0 + b1] = dq.reshape(num_heads, b1 - b0, -1).permute(1, 0, 2)
            dk_tkd[k0:k0 + used] += torch.einsum("kgqn,kgqd->nkd", dscores, q_kgqd[:, :, b0:b1])
    return dq_thd, dk_tkd, dv_tkd


def _query_blocks(n_q: int, n_k: int, num_heads: int) -> list[tuple[int, int]]:
    size = max(16, MATH_BLOCK_ELEMENTS // max(1, num_heads * n_k))
    return [(b, min(b + size, n_q)) for b in range(0, n_q, size)]


def _masked_scores(q_kgqd: torch.Tensor, k_kdn: torch.Tensor, first_query: int, offset: int,
                   scale: float) -> torch.Tensor:
    """Scores of a block of queries (first index ``first_query`` in its segment) against the keys
    they may see; query t sees key j iff j <= t + offset (offset = n_k - n_q, bottom-right)."""
    scores = torch.einsum("kgqd,kdn->kgqn", q_kgqd, k_kdn) * scale
    n_block, n_used = scores.shape[-2], scores.shape[-1]
    rows = torch.arange(first_query, first_query + n_block, device=scores.device).unsqueeze(1)
    cols = torch.arange(n_used, device=scores.device).unsqueeze(0)
    return scores.masked_fill(cols > rows + offset, float("-inf"))


def _heads_first(x_tkd: torch.Tensor) -> torch.Tensor:
    """(T, K, D) -> (1, K, T, D), a view. The CPU kernels take fewer KV heads than query heads
    (GQA: query head h reads KV head h // (H/K)) and return dK/dV per KV head, so nothing is repeated."""
    return x_tkd.transpose(0, 1).unsqueeze(0)


def _cpu_parts(n_q: int, n_k: int) -> list[tuple[int, int, bool]]:
    """Key ranges of a segment and whether each is causal: [0, n_k - n_q) fully visible, then the
    last n_q keys as a top-left-causal square."""
    offset = n_k - n_q
    return ([(0, offset, False)] if offset > 0 else []) + [(offset, n_k, True)]


def cpu_forward(q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor, cu_q: list[int],
                cu_k: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_thd = torch.empty_like(q_thd)
    lse_th: torch.Tensor | None = None
    for (q0, q1), (k0, k1) in zip(_bounds(cu_q), _bounds(cu_k), strict=True):
        if q1 == q0:
            continue
        q_1htd = _heads_first(q_thd[q0:q1])
        k_1knd, v_1knd = _heads_first(k_tkd[k0:k1]), _heads_first(v_tkd[k0:k1])
        out, lse = None, None
        for a, b, causal in _cpu_parts(q1 - q0, k1 - k0):
            part_out, part_lse = op(q_1htd, k_1knd[:, :, a:b], v_1knd[:, :, a:b], 0.0, causal, scale=scale)
            if out is None:
                out, lse = part_out, part_lse
            else:
                merged = torch.logaddexp(lse, part_lse)
                out = (out * torch.exp(lse - merged).unsqueeze(-1).to(out.dtype)
                       + part_out * torch.exp(part_lse - merged).unsqueeze(-1).to(out.dtype))
                lse = merged
        assert out is not None and lse is not None
        if lse_th is None:
            lse_th = torch.empty(q_thd.shape[:2], dtype=lse.dtype, device=q_thd.device)
        out_thd[q0:q1] = out[0].transpose(0, 1)
        lse_th[q0:q1] = lse[0].T
    if lse_th is None:
        lse_th = torch.empty(q_thd.shape[:2], dtype=q_thd.dtype, device=q_thd.device)
    return out_thd, lse_th


def cpu_backward(dout_thd: torch.Tensor, q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                 out_thd: torch.Tensor, lse_th: torch.Tensor, cu_q: list[int], cu_k: list[int],
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    dq_thd = torch.zeros_like(q_thd)
    dk_tkd = torch.zeros_like(k_tkd)
    dv_tkd = torch.zeros_like(v_tkd)
    for (q0, q1), (k0, k1) in zip(_bounds(cu_q), _bounds(cu_k), strict=True):
        if q1 == q0:
            continue
        q_1htd, do_1htd, out_1htd = (_heads_first(t[q0:q1]) for t in (q_thd, dout_thd, out_thd))
        lse_1ht = lse_th[q0:q1].T.unsqueeze(0)
        k_1knd, v_1knd = _heads_first(k_tkd[k0:k1]), _heads_first(v_tkd[k0:k1])
        for a, b, causal in _cpu_parts(q1 - q0, k1 - k0):
            dq, dk, dv = op(do_1htd, q_1htd, k_1knd[:, :, a:b], v_1knd[:, :, a:b], out_1htd, lse_1ht, 0.0,
                            causal, scale=scale)
            dq_thd[q0:q1] += dq[0].transpose(0, 1)
            dk_tkd[k0 + a:k0 + b] += dk[0].transpose(0, 1)
            dv_tkd[k0 + a:k0 + b] += dv[0].transpose(0, 1)
    return dq_thd, dk_tkd, dv_tkd


# ---- GPU libraries: their forward keeps the log-sum-exp, their backward kernel uses it ----------
# Both are called one packed call per cell with the prefix in front of each segment's own keys
# (bottom-right causal), so no partial results need merging; the LSE stays in the library's layout.
# These are the libraries' internal entry points (the public functions hide the LSE inside their own
# autograd graph), so ``has_flash``/``has_torch_varlen`` admit only the versions they were written for.

FLASH_MIN_VERSION = (2, 6)
"""flash-attn 2.6 added ``softcap`` to ``_flash_attn_varlen_backward``; the keyword call below needs it."""


@functools.cache
def has_flash() -> bool:
    if not has_module("flash_attn"):
        return False
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("flash_attn")
    except PackageNotFoundError:
        return False
    return tuple(int(part) for part in found.split(".")[:2] if part.isdigit()) >= FLASH_MIN_VERSION


@functools.cache
def has_torch_varlen() -> bool:
    return torch_varlen() is not None and hasattr(torch.ops.torch_attn, "_varlen_attn_backward")


def flash_library() -> Any:
    from flash_attn import flash_attn_interface

    return flash_attn_interface


def torch_library() -> Any:
    torch_varlen()  # importing the module registers torch's varlen ops
    return torch.ops.torch_attn


@functools.lru_cache(maxsize=1024)
def _device_offsets(cu: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``cu_seqlens`` as int32 on ``device``: copied once per distinct list (every layer of a cell
    reuses it), not once per call."""
    return torch.tensor(cu, dtype=torch.int32).to(device)


def _library_args(q_thd: torch.Tensor, cu_q: list[int], cu_k: list[int]) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(cu_q, cu_k on the device, longest query segment, longest key segment)."""
    return (_device_offsets(tuple(cu_q), q_thd.device), _device_offsets(tuple(cu_k), q_thd.device),
            max(b - a for a, b in _bounds(cu_q)), max(b - a for a, b in _bounds(cu_k)))


def flash_forward(q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor, cu_q: list[int],
                  cu_k: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    if q_thd.shape[-1] % 8:
        raise ValueError(f"flash_attn needs a head dim that is a multiple of 8, got {q_thd.shape[-1]}")
    out_thd, lse, *_ = flash_library()._flash_attn_varlen_forward(
        q_thd, k_tkd, v_tkd, *_library_args(q_thd, cu_q, cu_k), dropout_p=0.0, softmax_scale=scale, causal=True)
    return out_thd, lse


def flash_backward(dout_thd: torch.Tensor, q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                   out_thd: torch.Tensor, lse: torch.Tensor, cu_q: list[int], cu_k: list[int],
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq_thd, dk_tkd, dv_tkd = torch.empty_like(q_thd), torch.empty_like(k_tkd), torch.empty_like(v_tkd)
    flash_library()._flash_attn_varlen_backward(
        dout_thd, q_thd, k_tkd, v_tkd, out_thd, lse, dq_thd, dk_tkd, dv_tkd, *_library_args(q_thd, cu_q, cu_k),
        dropout_p=0.0, softmax_scale=scale, causal=True, window_size_left=-1, window_size_right=-1, softcap=0.0,
        alibi_slopes=None, deterministic=False)
    return dq_thd, dk_tkd, dv_tkd


# torch's varlen attention is causal with bottom-right alignment for the window (-1, 0)
_TORCH_CAUSAL_WINDOW = [-1, 0]


def torch_forward(q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor, cu_q: list[int],
                  cu_k: list[int], scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out_thd, lse, _rng = torch_library()._varlen_attn(
        q_thd, k_tkd, v_tkd, *_library_args(q_thd, cu_q, cu_k), True, scale, _TORCH_CAUSAL_WINDOW,
        q_thd.shape[1] != k_tkd.shape[1])
    return out_thd, lse


def torch_backward(dout_thd: torch.Tensor, q_thd: torch.Tensor, k_tkd: torch.Tensor, v_tkd: torch.Tensor,
                   out_thd: torch.Tensor, lse: torch.Tensor, cu_q: list[int], cu_k: list[int],
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=q_thd.device)  # no dropout: unused
    dq, dk, dv = torch_library()._varlen_attn_backward(
        dout_thd, q_thd, k_tkd, v_tkd, out_thd, lse, *_library_args(q_thd, cu_q, cu_k), True, rng_state, scale,
        _TORCH_CAUSAL_WINDOW)
    return dq, dk, dv


KERNELS = {"math": (math_forward, math_backward), "cpu": (cpu_forward, cpu_backward),
           "flash": (flash_forward, flash_backward), "torch": (torch_forward, torch_backward)}
