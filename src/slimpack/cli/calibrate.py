"""``slimpack calibrate``: time the runtime's ops on this machine, fit the cost model's efficiency
parameters and write a config usable as ``--config`` (cluster = this machine: measured peak FLOP/s,
memory bandwidth, RAM; efficiency = the fit). Imports torch only when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from slimpack.cli.common import add_config_arguments, config_from_args, positive_int
from slimpack.config import ClusterConfig
from slimpack.config.defaults import CALIBRATION_CONFIG
from slimpack.errors import UserError

HELP = "measure this machine's op timings, fit the cost model and write a config (--config) for it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default="calibration.json", metavar="FILE",
                        help="config file to write (default calibration.json)")
    parser.add_argument("--records", metavar="FILE", help="also write the raw timing records (JSON) here")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--threads", type=positive_int, default=1, metavar="N",
                        help="torch threads while timing; use what each training process will use (default 1)")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N", help="timed repeats per op (default 5)")
    add_config_arguments(parser, default=CALIBRATION_CONFIG)


def run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        raise UserError("slimpack calibrate needs PyTorch: install slimpack[torch]") from None
    from slimpack.cost.calibrate import fit_efficiency, save_records
    from slimpack.runtime.calibrate import collect_records, memory_bandwidth, peak_flops

    torch.set_num_threads(args.threads)
    base = config_from_args(args)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    dtype_bytes = 8 if args.dtype == "float64" else 4
    model = dataclasses.replace(base.model, dtype_bytes=dtype_bytes)
    peak = peak_flops(dtype)
    bandwidth = memory_bandwidth()
    print(f"peak {peak / 1e9:.1f} GFLOP/s ({args.dtype} matmul, {args.threads} thread(s)), memory bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s", flush=True)
    records = collect_records(model, dtype=dtype, repeats=args.repeats)
    if args.records:
        save_records(records, args.records)
    result = fit_efficiency(records, model, peak)
    eff, ratio, check = _end_to_end(base, model, peak, bandwidth, result.efficiency, dtype, args.repeats)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cluster = ClusterConfig(name="measured-cpu", peak_flops=peak, memory_bytes=ram, reserved_memory_bytes=0,
                            hbm_bandwidth=bandwidth, gpus_per_node=max(base.parallel.num_devices, 1),
                            intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)
    config = dataclasses.replace(base, model=model, cluster=cluster, efficiency=eff)
    Path(args.output).write_text(json.dumps(_plain(config.to_dict()), indent=2) + "\n")
    print(f"calibrated: gemm_max {eff.gemm_max:.3f}, gemm_half_tokens {eff.gemm_half_tokens:.0f}, "
          f"attention_max {eff.attention_max:.3f}, attention_half_tokens {eff.attention_half_tokens:.0f}, "
          f"layer_overhead {eff.layer_overhead_s * 1e6:.0f} us")
    print(f"op fit error: MAPE {result.mape:.1%}, max {result.max_ape:.1%} over {result.num_records} timings")
    print(f"end to end (executor forward + backward of whole groups): GEMM x {ratio[0]:.3f}, attention x {ratio[1]:.3f}, "
          f"layer overhead {eff.layer_overhead_s * 1e6:.0f} us; remaining error per group: "
          + ", ".join(f"{tokens} tokens {error:+.1%}" for tokens, error in check) + f" -> {args.output}")
    return 0


END_TO_END_GROUPS = ((256,), (1024,), (2048,), (256,) * 8, (128,) * 16, (512,) * 4, (1024, 512, 256, 128, 64, 64))


def _end_to_end(base, model, peak, bandwidth, eff, dtype, repeats):  # noqa: ANN001, ANN202
    """Scale the op-level fit so that whole executor steps come out right: time the runtime's forward
    + backward of a few groups (single samples and packs) through the whole model, fit measured =
    g x (the op fit's GEMM time) + a x (its attention time) + overhead x (layers run) + the rest, and
    divide the GEMM and attention efficiencies by g and a and take the fitted per-layer overhead. This absorbs what single-op timings miss: the executor's own work
    (packing, cells, RoPE tables, the loss) and the real backward/forward ratios of this machine."""

    from slimpack.config import ClusterConfig, ParallelConfig
    from slimpack.config.efficiency import with_attention_scale
    from slimpack.cost import CostModel
    from slimpack.runtime.calibrate import stage_timings

    cluster = ClusterConfig(name="measured-cpu", peak_flops=peak, memory_bytes=2**40, reserved_memory_bytes=0,
                            hbm_bandwidth=bandwidth, gpus_per_node=1, intra_node_bandwidth=bandwidth,
                            inter_node_bandwidth=bandwidth)

    def predict(efficiency):  # noqa: ANN001, ANN202
        config = dataclasses.replace(base, model=model, cluster=cluster, efficiency=efficiency,
                                     parallel=ParallelConfig())
        cost = CostModel(config)
        return [sum(cost.group_time(list(g), [0] * len(g), virtual_stage=0, backward=b) for b in (False, True))
                for g in END_TO_END_GROUPS]

    import numpy as np

    measured = np.array(stage_timings(model, END_TO_END_GROUPS, dtype=dtype, repeats=repeats))
    bare = dataclasses.replace(eff, layer_overhead_s=0.0)
    compute = np.array(predict(bare))
    # the parts of the prediction: GEMM time, attention time (each ∝ 1 / its efficiency), per-layer overhead
    gemm = np.array(predict(dataclasses.replace(bare, gemm_max=eff.gemm_max / 2))) - compute
    attention = np.array(predict(with_attention_scale(bare, 2.0))) - compute
    per_overhead = (np.array(predict(dataclasses.replace(bare, layer_overhead_s=1e-3))) - compute) / 1e-3
    rest = compute - gemm - attention
    # measured - rest ≈ g · gemm + a · attention + overhead · per_overhead (least squares, relative)
    weights = 1.0 / measured
    features = np.stack([gemm, attention, per_overhead], axis=1)
    (g, a, overhead), *_ = np.linalg.lstsq(features * weights[:, None], (measured - rest) * weights, rcond=None)
    if min(g, a, overhead) <= 0:  # degenerate: one common factor, no separate overhead
        g = a = float(np.median(measured / compute))
        overhead = 0.0
    ratio = (g, a)
    scaled = dataclasses.replace(with_attention_scale(eff, a), gemm_max=min(1.0, eff.gemm_max / g),
                                 layer_overhead_s=float(overhead))
    check = [(sum(g), p / m - 1) for g, m, p in zip(END_TO_END_GROUPS, measured, predict(scaled), strict=True)]
    return scaled, ratio, check


def _plain(value: object) -> object:
    """numpy scalars -> Python floats, recursively (the fit returns numpy values)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()  # type: ignore[no-any-return, attr-defined]
    return value
