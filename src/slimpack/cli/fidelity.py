"""``slimpack fidelity``: run plans of several strategies for real (tiny model, CPU, one process per
stage and replica) and in the simulator with a calibrated config; print predicted vs measured step
time and peak activation memory per plan, and their mean absolute percentage errors (MAPE); with tp or
cp > 1 also the bytes sent in tensor- and context-parallel collectives.
Imports torch only when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from slimpack.cli.common import (
    add_config_arguments,
    add_dataset_arguments,
    add_planner_arguments,
    context_note,
    dataset_from_args,
    hf_config_arg,
    non_negative_int,
    positive_float,
    positive_int,
    runtime_config_from_args,
)
from slimpack.compare.run import check_strategies
from slimpack.config.defaults import RUNTIME_CONFIG
from slimpack.errors import UserError
from slimpack.units import MIB

if TYPE_CHECKING:
    from slimpack.runtime.fidelity import FidelityRow

HELP = "compare the simulator with real runs of plans (step time, activation memory) on this machine"

DEFAULT_STRATEGIES = "fixed,bfd,kk,wlb,slimpipe,bytescale,slimpack"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES, metavar="S,S",
                        help=f"strategies to plan with (default {DEFAULT_STRATEGIES})")
    add_dataset_arguments(parser, default="stdlib",
                          extra="'stdlib' (the CPython sources' sizes in bytes, as slimpack train uses), a ")
    parser.add_argument("--step", type=non_negative_int, default=0, metavar="I",
                        help="which global batch to plan (default 0)")
    parser.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="timed steps per plan (default 3)")
    parser.add_argument("--threads", type=positive_int, default=1, metavar="N",
                        help="torch threads per process (use what calibrate used; default 1)")
    parser.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS", help="per plan (default 600)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--rescale", action="store_true",
                        help="re-measure the peak FLOP/s before each plan and scale the prediction by "
                             "calibrated / current peak (for machines whose speed drifts with other jobs' load)")
    add_config_arguments(parser, default=RUNTIME_CONFIG)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("slimpack fidelity needs PyTorch: install slimpack[torch]") from None
    from slimpack.data.text import TextCorpus
    from slimpack.runtime.fidelity import check_layout, fidelity_row, mape

    strategies = [s for s in args.strategies.split(",") if s]
    check_strategies(strategies)
    config = runtime_config_from_args(args)
    if config.train.recompute != "none":  # the runtime keeps every activation
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, recompute="none"))
    check_layout(config)
    dataset = TextCorpus.stdlib().dataset() if args.dataset == "stdlib" else dataset_from_args(args)
    if not args.json:
        print(context_note(dataset, config), flush=True)
    rows = []
    for name in strategies:
        rows.append(fidelity_row(config, dataset, name, step=args.step, repeats=args.repeats, threads=args.threads,
                                 timeout_s=args.timeout, rescale=args.rescale, hf_config=hf_config_arg(args)))
        if not args.json:
            print(_line(rows[-1], args.rescale), flush=True)
    time_mape, mem_mape = mape([r.step_error for r in rows]), mape([r.memory_error for r in rows])
    if args.json:
        print(json.dumps({"rows": [dataclasses.asdict(r) for r in rows], "step_time_mape": time_mape,
                          "memory_mape": mem_mape}, indent=2))
    else:
        print(f"MAPE over {len(rows)} plans: step time {time_mape:.1%}, peak activation memory {mem_mape:.2%}")
    return 0


def _line(row: FidelityRow, rescaled: bool) -> str:
    note = f" (x{row.speed_scale:.3f} for the machine's current speed)" if rescaled else ""
    return (f"{row.strategy:10s} {row.tokens:6d} tokens {row.groups:3d} groups  step: predicted "
            f"{row.predicted_step_s:.3f} s{note}, measured {row.measured_step_s:.3f} s ({row.step_error:+.1%})  "
            f"activations: predicted {row.predicted_activation_bytes / MIB:.2f} MiB, measured "
            f"{row.measured_activation_bytes / MIB:.2f} MiB ({row.memory_error:+.2%})"
            + "".join(f"\n{'':10s} {label} communication: predicted {row.predicted_comm_bytes.get(label, 0.0) / MIB:.2f} MiB "
                      f"(layers), measured {sent / MIB:.2f} MiB (all on the {label} groups)"
                      for label, sent in row.measured_comm_bytes.items()))
