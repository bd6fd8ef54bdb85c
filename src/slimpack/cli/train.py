"""``slimpack train``: train a model for a few steps with a strategy's plans, one rank per
(replica, stage), on real text available offline (the CPython standard library, byte-level).

Run it under torchrun with pp x dp processes, e.g.
``torchrun --nproc-per-node 2 -m slimpack train --model tiny --pp 2 --dp 1 --steps 2``;
without torchrun it runs in this process when pp = dp = 1. Logs loss, tokens/s and the planner's
time per step (rank 0) and can write each rank's Chrome trace of the real run. The loop itself is
``runtime.trainer.Trainer``; this module reads the flags. Imports torch only when it runs.
"""

from __future__ import annotations

import argparse

from slimpack.cli.common import (
    add_config_arguments,
    add_planner_arguments,
    check_output,
    hf_config_arg,
    positive_float,
    positive_int,
    runtime_config_from_args,
)
from slimpack.compare.run import check_strategies
from slimpack.config.defaults import PRECISIONS, RUNTIME_CONFIG
from slimpack.errors import UserError

HELP = "train a model on plans of a strategy over torch.distributed (torchrun; CPython stdlib text)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="slimpack", metavar="S", help="planning strategy (default slimpack)")
    parser.add_argument("--steps", type=positive_int, default=2, metavar="N", help="optimizer steps (default 2)")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--precision", choices=PRECISIONS, default="full",
                        help="full: compute in --dtype; bf16: bf16 compute with float32 master weights, "
                             "gradients and gradient reduction (default full)")
    parser.add_argument("--attention", choices=("auto", "cpu", "math", "flash", "torch"), default="auto",
                        help="attention backend (default auto: the fastest usable here)")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("--max-files", type=positive_int, metavar="N", help="use only the first N stdlib files")
    parser.add_argument("--no-plan-ahead", dest="plan_ahead", action="store_false",
                        help="plan each step when it starts instead of on a background thread")
    parser.add_argument("--trace-dir", metavar="DIR", help="write each rank's Chrome trace (rank<R>.json) here")
    parser.add_argument("--log-json", metavar="FILE", help="rank 0 writes per-step records (JSON) here")
    parser.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                        help="any wait on another rank (receive, send, barrier, all-reduce) longer than this "
                             "aborts the job with a message naming the rank and the action (default 300)")
    add_config_arguments(parser, default=RUNTIME_CONFIG)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("slimpack train needs PyTorch: install slimpack[torch]") from None
    from slimpack.runtime.trainer import Trainer, TrainOptions

    check_strategies([args.strategy])
    if args.use_milp:  # the loader turns it off; asked for by name, say so rather than ignore it
        raise UserError("--milp: slimpack train plans every step on every rank and needs identical plans, "
                        "which the MILP refinement (stopped at a wall-clock limit) cannot promise")
    options = TrainOptions(strategy=args.strategy, steps=args.steps, lr=args.lr, dtype=args.dtype,
                           attention=args.attention, shuffle=args.shuffle, max_files=args.max_files,
                           plan_ahead=args.plan_ahead, trace_dir=args.trace_dir, log_json=args.log_json,
                           timeout_s=args.timeout, precision=args.precision,
                           hf_config=hf_config_arg(args))
    if args.trace_dir:
        check_output(args.trace_dir, "--trace-dir", directory=True)
    if args.log_json:
        check_output(args.log_json, "--log-json")
    Trainer(runtime_config_from_args(args), options, argv=args.argv).run()
    return 0
