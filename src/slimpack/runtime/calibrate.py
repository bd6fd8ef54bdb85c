"""Time the runtime's own ops on this machine and turn them into ``TimingRecord``s for the fit in
``slimpack.cost.calibrate`` (which must not import torch; this module does the measuring).

What is timed (forward, with autograd recording, as the executor runs it; fastest of repeats, since
on a shared machine other jobs only add time):
- ``gemm``: a layer's row-wise part over T tokens (norms, Q/K/V and output projections, RoPE, MLP):
  ``Block.attention_inputs`` + ``Block.finish`` with a precomputed attention output;
- ``attention``: ``varlen_attention`` of one slice of c tokens after a prefix of p tokens;
- ``layer``: a whole layer on one slice (T tokens, no prefix);
- the machine's peak FLOP/s: the best of several large square matmuls (the fit needs a peak;
  efficiency is measured against it) and its memory bandwidth (a large copy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from slimpack.config import ModelConfig
from slimpack.cost.calibrate import TimingRecord
from slimpack.runtime.attention import resolve_backend, varlen_attention
from slimpack.runtime.model import Block
from slimpack.runtime.ops import rope_tables


def time_call(fn: Callable[[], object], *, repeats: int = 5, min_time_s: float = 0.02) -> float:
    """Seconds of ``fn()``: the fastest of ``repeats`` timed batches (each long enough to time). The
    minimum, not the median: on a shared machine other jobs only ever add time."""
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
    return min(samples)


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


def stage_timings(model: ModelConfig, groups: Sequence[Sequence[int]], *, dtype: torch.dtype = torch.float32,
                  repeats: int = 3) -> list[float]:
    """Seconds of forward + backward of each group (sample lengths, one whole sample per slice) through
    the whole model as one stage with the ``StageExecutor``: the runtime's end-to-end cost, overheads
    included (fastest of ``repeats`` after a warm-up)."""
    from slimpack.plan.types import Slice
    from slimpack.runtime.executor import StageExecutor
    from slimpack.runtime.loss import count_loss_tokens
    from slimpack.runtime.model import build_model

    net = build_model(model, seed=0, dtype=dtype)
    (stage,) = net.split(1)
    out = []
    for lengths in groups:
        group = tuple(Slice(i, 0, n) for i, n in enumerate(lengths))
        tokens = {i: torch.randint(0, model.vocab_size, (n,)) for i, n in enumerate(lengths)}

        def run(group=group, tokens=tokens, lengths=lengths) -> None:
            executor = StageExecutor(stage, (group,), (group,), sample_lengths=dict(enumerate(lengths)),
                                     tokens=tokens, num_loss_tokens=count_loss_tokens(lengths))
            executor.forward(0)
            executor.backward(0)

        run()
        samples = []
        for _ in range(repeats):
            samples.append(_timed(run))
        out.append(min(samples))
    return out
