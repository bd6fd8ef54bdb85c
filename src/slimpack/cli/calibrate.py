"""``slimpack calibrate``: time the runtime's ops on this machine, fit the cost model's efficiency
parameters and write a config usable as ``--config`` (cluster = this machine: measured peak FLOP/s,
memory bandwidth, RAM; efficiency = the fit). Imports torch only when it runs.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from slimpack.cli.common import add_config_arguments, check_output, config_from_args, positive_int
from slimpack.config.defaults import CALIBRATION_CONFIG
from slimpack.errors import UserError
from slimpack.files import output_path

if TYPE_CHECKING:
    from slimpack.cost.calibrate import CalibrationResult
    from slimpack.cost.end_to_end import EndToEndFit

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
    from slimpack.cost.calibrate import save_records
    from slimpack.runtime.calibrate import calibrate

    check_output(args.output, "--output")
    if args.records:
        check_output(args.records, "--records")
    torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    result = calibrate(config_from_args(args), dtype=dtype, repeats=args.repeats,
                       say=lambda line: print(f"{line}, {args.threads} thread(s)", flush=True))
    if args.records:
        save_records(result.records, args.records)
    output_path(args.output).write_text(json.dumps(result.config.to_dict(), indent=2) + "\n")
    _report(result.ops, result.fit, args.output)
    return 0


def _report(ops: CalibrationResult, fit: EndToEndFit, output: str) -> None:
    eff = fit.efficiency
    print(f"calibrated: gemm_max {eff.gemm_max:.3f}, gemm_half_tokens {eff.gemm_half_tokens:.0f}, "
          f"attention_max {eff.attention_max:.3f}, attention_half_tokens {eff.attention_half_tokens:.0f}, "
          f"layer_overhead {eff.layer_overhead_s * 1e6:.0f} us")
    print(f"op fit error: MAPE {ops.mape:.1%}, max {ops.max_ape:.1%} over {ops.num_records} timings")
    print(f"end to end (executor forward + backward of whole groups): GEMM x {fit.gemm_ratio:.3f}, attention x "
          f"{fit.attention_ratio:.3f}, layer overhead {eff.layer_overhead_s * 1e6:.0f} us; remaining error per "
          "group: " + ", ".join(f"{tokens} tokens {error:+.1%}" for tokens, error in fit.errors) + f" -> {output}")
