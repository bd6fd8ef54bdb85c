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

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from slimpack.config import Config, ModelConfig
from slimpack.cost.calibrate import CalibrationResult, TimingRecord, fit_efficiency
from slimpack.cost.end_to_end import (
    END_TO_END_GROUPS,
    EndToEndFit,
    fit_end_to_end,
    measured_cluster,
)
from slimpack.runtime.attention import resolve_backend, varlen_attention
from slimpack.runtime.model import Block
from slimpack.runtime.ops import rope_tables


def _synced(fn: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """``fn`` followed by waiting for the device: GPU work is asynchronous to the host clock."""
    if device.type != "cuda":
        return fn

    def run() -> None:
        fn()
        torch.cuda.synchronize(device)
    return run


def time_call(fn: Callable[[], object], *, repeats: int = 5, min_time_s: float = 0.02,
              device: torch.device | str = "cpu") -> float:
    """Seconds of ``fn()``: the fastest of ``repeats`` timed batches (each long enough to time). The
    minimum, not the median: on a shared machine other jobs only ever add time."""
    fn = _synced(fn, torch.device(device))
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


def peak_flops(dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5,
               device: torch.device | str = "cpu") -> float:
    """FLOP/s of the best of ``repeats`` (size x size) @ (size x size) matmuls."""
    device = torch.device(device)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    mm = _synced(lambda: torch.mm(a, b), device)
    mm()
    best = min(_timed(mm) for _ in range(repeats))
    return 2.0 * size**3 / best


def memory_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Bytes/s of a large copy (read + write counted)."""
    device = torch.device(device)
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    copy = _synced(lambda: dst.copy_(src), device)
    copy()
    best = min(_timed(copy) for _ in range(repeats))
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
                    backend: str = "auto", repeats: int = 5, device: torch.device | str = "cpu") -> list[TimingRecord]:
    """Timing records of one layer of ``model`` (weights random; timings do not depend on values)."""
    torch.manual_seed(0)
    device = torch.device(device)
    block = Block(model).to(device=device, dtype=dtype)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    resolved = resolve_backend(backend, device, dtype)
    cfg = model
    records: list[TimingRecord] = []
    factory = {"dtype": dtype, "device": device}

    def timed(fn: Callable[[], object]) -> float:
        return time_call(fn, repeats=repeats, device=device)

    def inputs(tokens: int, prefix: int = 0) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        x = torch.randn(tokens, cfg.hidden, **factory, requires_grad=True)
        return x, rope_tables(torch.arange(prefix, prefix + tokens, device=device), cfg.head_dim, dtype=dtype)

    with torch.enable_grad():
        for tokens in gemm_tokens:
            x, table = inputs(tokens)
            attn = torch.randn(tokens, cfg.num_heads, cfg.head_dim, **factory, requires_grad=True)

            def rowwise(x=x, table=table, attn=attn) -> object:
                block.attention_inputs(x, *table)
                return block.finish(x, attn)

            records.append(TimingRecord(op="gemm", tokens=(tokens,), prefix=(0,),
                                        time_s=timed(rowwise)))
        for tokens in attention_tokens:
            for multiple in prefix_multiples:
                prefix = multiple * tokens
                q = torch.randn(tokens, cfg.num_heads, cfg.head_dim, **factory, requires_grad=True)
                k = torch.randn(tokens, cfg.num_kv_heads, cfg.head_dim, **factory, requires_grad=True)
                v = torch.randn_like(k, requires_grad=True)
                pieces = ([(torch.randn(prefix, cfg.num_kv_heads, cfg.head_dim, **factory),
                            torch.randn(prefix, cfg.num_kv_heads, cfg.head_dim, **factory))] if prefix else [])

                def attention(q=q, k=k, v=v, pieces=pieces, tokens=tokens) -> object:
                    return varlen_attention(q, k, v, [0, tokens], prefix=[pieces], backend=resolved)

                records.append(TimingRecord(op="attention", tokens=(tokens,), prefix=(prefix,),
                                            time_s=timed(attention)))
        for tokens in layer_tokens:
            x, table = inputs(tokens)

            def layer(x=x, table=table, tokens=tokens) -> object:
                q, k, v = block.attention_inputs(x, *table)
                return block.finish(x, varlen_attention(q, k, v, [0, tokens], backend=resolved))

            records.append(TimingRecord(op="layer", tokens=(tokens,), prefix=(0,),
                                        time_s=timed(layer)))
    return records


def stage_timings(model: ModelConfig, groups: Sequence[Sequence[int]], *, dtype: torch.dtype = torch.float32,
                  repeats: int = 3, device: torch.device | str = "cpu") -> list[float]:
    """Seconds of forward + backward of each group (sample lengths, one whole sample per slice) through
    the whole model as one stage with the ``StageExecutor``: the runtime's end-to-end cost, overheads
    included (fastest of ``repeats`` after a warm-up)."""
    from slimpack.plan.types import Slice
    from slimpack.runtime.executor import StageExecutor
    from slimpack.runtime.loss import count_loss_tokens
    from slimpack.runtime.model import build_model

    device = torch.device(device)
    net = build_model(model, seed=0, dtype=dtype, device=device)
    (stage,) = net.split(1)
    out = []
    for lengths in groups:
        group = tuple(Slice(i, 0, n) for i, n in enumerate(lengths))
        tokens = {i: torch.randint(0, model.vocab_size, (n,), device=device) for i, n in enumerate(lengths)}

        def run(group=group, tokens=tokens, lengths=lengths) -> None:
            executor = StageExecutor(stage, (group,), (group,), sample_lengths=dict(enumerate(lengths)),
                                     tokens=tokens, num_loss_tokens=count_loss_tokens(lengths))
            executor.forward(0)
            executor.backward(0)

        synced = _synced(run, device)
        synced()
        out.append(min(_timed(synced) for _ in range(repeats)))
    return out


@dataclass(frozen=True, slots=True)
class Calibration:
    config: Config
    """``base`` with this machine as its cluster, the model in the timed dtype, the fitted efficiency."""
    records: list[TimingRecord]
    ops: CalibrationResult
    fit: EndToEndFit
    peak_flops: float
    bandwidth: float


DTYPE_BYTES = {torch.float64: 8, torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def calibrate(base: Config, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
              repeats: int = 5, say: Callable[[str], None] = print) -> Calibration:
    """Time this machine (the CPU, or one GPU) and fit the cost model to it: peak FLOP/s and memory
    bandwidth, the op timings (``fit_efficiency``), then the executor's whole-group times
    (``fit_end_to_end``). The cluster's memory is the device's (RAM for the CPU)."""
    device = torch.device(device)
    model = dataclasses.replace(base.model, dtype_bytes=DTYPE_BYTES[dtype])
    peak, bandwidth = peak_flops(dtype, device=device), memory_bandwidth(device=device)
    say(f"peak {peak / 1e9:.1f} GFLOP/s ({dtype} matmul on {device}), memory bandwidth {bandwidth / 1e9:.1f} GB/s")
    records = collect_records(model, dtype=dtype, repeats=repeats, device=device)
    ops = fit_efficiency(records, model, peak)
    if device.type == "cuda":
        memory, name = torch.cuda.get_device_properties(device).total_memory, "measured-gpu"
    else:
        memory, name = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "measured-cpu"
    cluster = dataclasses.replace(measured_cluster(peak_flops=peak, bandwidth=bandwidth, memory_bytes=memory,
                                                   devices=base.parallel.num_devices), name=name)
    measured = stage_timings(model, END_TO_END_GROUPS, dtype=dtype, repeats=repeats, device=device)
    fit = fit_end_to_end(dataclasses.replace(base, model=model, cluster=cluster), ops.efficiency, measured)
    config = dataclasses.replace(base, model=model, cluster=cluster, efficiency=fit.efficiency)
    return Calibration(config=config, records=records, ops=ops, fit=fit, peak_flops=peak, bandwidth=bandwidth)
