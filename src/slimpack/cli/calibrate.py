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
from slimpack.config import ClusterConfig, TrainConfig, build_config
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
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        raise UserError("slimpack calibrate needs PyTorch: install slimpack[torch]") from None
    from slimpack.cost.calibrate import fit_efficiency, save_records
    from slimpack.runtime.calibrate import collect_records, memory_bandwidth, peak_flops

    torch.set_num_threads(args.threads)
    base = config_from_args(args, default=build_config(model="tiny", train=TrainConfig(
        max_context=2048, global_batch_tokens=8192, recompute="none")))
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
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cluster = ClusterConfig(name="measured-cpu", peak_flops=peak, memory_bytes=ram, reserved_memory_bytes=0,
                            hbm_bandwidth=bandwidth, gpus_per_node=max(base.parallel.num_devices, 1),
                            intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)
    config = dataclasses.replace(base, model=model, cluster=cluster, efficiency=result.efficiency)
    Path(args.output).write_text(json.dumps(_plain(config.to_dict()), indent=2) + "\n")
    eff = result.efficiency
    print(f"{len(records)} timings: gemm_max {eff.gemm_max:.3f}, gemm_half_tokens {eff.gemm_half_tokens:.0f}, "
          f"attention_max {eff.attention_max:.3f}, attention_half_tokens {eff.attention_half_tokens:.0f}, "
          f"layer_overhead {eff.layer_overhead_s * 1e6:.0f} us")
    print(f"fit error: MAPE {result.mape:.1%}, max {result.max_ape:.1%} -> {args.output}")
    return 0


def _plain(value: object) -> object:
    """numpy scalars -> Python floats, recursively (the fit returns numpy values)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()  # type: ignore[no-any-return, attr-defined]
    return value
