"""Time the runtime's own ops on this machine and turn them into ``TimingRecord``s for the fit in
``slimpack.cost.calibrate`` (which must not import torch; this module does the measuring).

What is timed (forward, with autograd recording, as the executor runs it; median of repeats):
- ``gemm``: a layer's row-wise part over T tokens (norms, Q/K/V and output projections, RoPE, MLP):
  ``Block.attention_inputs`` + ``Block.finish`` with a precomputed attention output;
- ``attention``: ``varlen_attention`` of one slice of c tokens after a prefix of p tokens;
- ``layer``: a whole layer on one slice (T tokens, no prefix);
- the machine's peak FLOP/s: the best of several large square matmuls (the fit needs a peak;
  efficiency is measured against it) and its memory bandwidth (a large copy).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from slimpack.config import ModelConfig
from slimpack.cost.calibrate import TimingRecord
from slimpack.runtime.attention import resolve_backend, varlen_attention
from slimpack.runtime.model import Block
from slimpack.runtime.ops import rope_tables


def time_call(fn: Callable[[], object], *, repeats: int = 5, min_time_s: float = 0.02) -> float:
    """Median seconds of ``fn()`` over ``repeats`` timed batches (each long enough to time)."""
    fn()  # warm-up
    began = time.perf_counter()
    fn()
    once = max(time.perf_counter() - began, 1e-7)
    inner = max(1, int(min_time_s / once))
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - began) / inner)
    return statistics.median(samples)


def peak_flops(dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` (size x size) @ (size x size) matmuls."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2.0 * size**3 / best


def memory_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a large copy (read + write counted)."""
    src = torch.empty(num_bytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2.0 * num_bytes / best


def _timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def collect_records(model: ModelConfig, *, dtype: torch.dtype = torch.float32,
                    gemm_tokens: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048, 4096),
                    attention_tokens: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048),
                    prefix_multiples: Sequence[int] = (0, 1, 3),
                    layer_tokens: Sequence[int] = (64, 256, 1024, 2048),
                    backend: str = "auto", repeats: int = 5) -> list[TimingRecord]:
    """Timing records of one layer of ``model`` (weights random; timings do not depend on values)."""
    torch.manual_seed(0)
    block = Block(model).to(dtype)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    resolved = resolve_backend(backend, torch.device("cpu"), dtype)
    cfg = model
    records: list[TimingRecord] = []

    def inputs(tokens: int, prefix: int = 0) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        x = torch.randn(tokens, cfg.hidden, dtype=dtype, requires_grad=True)
        return x, rope_tables(torch.arange(prefix, prefix + tokens), cfg.head_dim, dtype=dtype)

    with torch.enable_grad():
        for tokens in gemm_tokens:
            x, table = inputs(tokens)
            attn = torch.randn(tokens, cfg.num_heads, cfg.head_dim, dtype=dtype, requires_grad=True)

            def rowwise(x=x, table=table, attn=attn) -> object:
                block.attention_inputs(x, *table)
                return block.finish(x, attn)

            records.append(TimingRecord(op="gemm", tokens=(tokens,), prefix=(0,),
                                        time_s=time_call(rowwise, repeats=repeats)))
        for tokens in attention_tokens:
            for multiple in prefix_multiples:
                prefix = multiple * tokens
                q = torch.randn(tokens, cfg.num_heads, cfg.head_dim, dtype=dtype, requires_grad=True)
                k = torch.randn(tokens, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, requires_grad=True)
                v = torch.randn_like(k, requires_grad=True)
                pieces = ([(torch.randn(prefix, cfg.num_kv_heads, cfg.head_dim, dtype=dtype),
                            torch.randn(prefix, cfg.num_kv_heads, cfg.head_dim, dtype=dtype))] if prefix else [])

                def attention(q=q, k=k, v=v, pieces=pieces, tokens=tokens) -> object:
                    return varlen_attention(q, k, v, [0, tokens], prefix=[pieces], backend=resolved)

                records.append(TimingRecord(op="attention", tokens=(tokens,), prefix=(prefix,),
                                            time_s=time_call(attention, repeats=repeats)))
        for tokens in layer_tokens:
            x, table = inputs(tokens)

            def layer(x=x, table=table, tokens=tokens) -> object:
                q, k, v = block.attention_inputs(x, *table)
                return block.finish(x, varlen_attention(q, k, v, [0, tokens], backend=resolved))

            records.append(TimingRecord(op="layer", tokens=(tokens,), prefix=(0,),
                                        time_s=time_call(layer, repeats=repeats)))
    return records
