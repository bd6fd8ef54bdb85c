"""``slimpack fidelity``: run plans of several strategies for real (tiny model, CPU, one process per
stage and replica) and in the simulator with a calibrated config; print predicted vs measured step
time and peak activation memory per plan, and their mean absolute percentage errors (MAPE).
Imports torch only when it runs.
"""

from __future__ import annotations

import argparse
import json

from slimpack.cli.common import (
    add_config_arguments,
    add_planner_arguments,
    config_from_args,
    positive_int,
)
from slimpack.config.defaults import RUNTIME_CONFIG
from slimpack.errors import UserError

HELP = "compare the simulator with real runs of plans (step time, activation memory) on this machine"

DEFAULT_STRATEGIES = "fixed,bfd,kk,wlb,slimpipe,bytescale,slimpack"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategies", default=DEFAULT_STRATEGIES, metavar="S,S",
                        help=f"strategies to plan with (default {DEFAULT_STRATEGIES})")
    parser.add_argument("--dataset", default="stdlib", metavar="D",
                        help="'stdlib' (the CPython sources' sizes in bytes, as slimpack train uses) or any dataset")
    parser.add_argument("--step", type=int, default=0, metavar="I", help="which global batch to plan (default 0)")
    parser.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="timed steps per plan (default 3)")
    parser.add_argument("--threads", type=positive_int, default=1, metavar="N",
                        help="torch threads per process (use what calibrate used; default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="per plan (default 600)")
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
    import dataclasses

    from slimpack.compare.run import check_strategies
    from slimpack.cost import CostModel
    from slimpack.data import load_dataset
    from slimpack.data.text import TextCorpus
    from slimpack.runtime.fidelity import (
        measure_rank,
        measured_activation_peaks,
        measured_step_time,
        predicted_activation_peaks,
    )
    from slimpack.runtime.launch import LaunchError, spawn
    from slimpack.sim import simulate
    from slimpack.strategies.stream import PlanStream

    strategies = [s for s in args.strategies.split(",") if s]
    check_strategies(strategies)
    config = config_from_args(args)
    if config.train.recompute != "none":
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, recompute="none"))
    par = config.parallel
    if par.tp != 1 or par.cp != 1:
        raise UserError("fidelity runs tp = cp = 1")
    dataset = TextCorpus.stdlib().dataset() if args.dataset == "stdlib" else load_dataset(args.dataset)
    rows = []
    for name in strategies:
        plan = next(PlanStream(dataset, config, name, start=args.step)).plan
        cost = CostModel(plan.config)
        sim = simulate(plan, cost)
        scale = 1.0
        if args.rescale:
            import torch

            from slimpack.runtime.calibrate import peak_flops

            torch.set_num_threads(args.threads)
            dtype = {4: torch.float32, 8: torch.float64, 2: torch.bfloat16}[plan.config.model.dtype_bytes]
            scale = config.cluster.peak_flops / peak_flops(dtype)
        try:
            per_rank = spawn(measure_rank, par.pp * par.dp, (plan, args.repeats, args.threads),
                             timeout_s=args.timeout, threads=args.threads)
        except LaunchError as exc:
            raise UserError(f"{name}: the real run failed: {exc}") from None
        measured_mem = measured_activation_peaks(per_rank, par.pp)
        predicted_mem = predicted_activation_peaks(sim, cost, par.pp)
        row = {"strategy": name, "tokens": sim.num_tokens, "groups": sum(len(p.forward) for p in plan.pipelines),
               "predicted_step_s": sim.step_time_s * scale, "speed_scale": scale, "measured_step_s": measured_step_time(per_rank),
               "predicted_activation_bytes": max(predicted_mem), "measured_activation_bytes": max(measured_mem)}
        rows.append(row)
        if not args.json:
            note = f" (x{scale:.3f} for the machine's current speed)" if args.rescale else ""
            print(f"{name:10s} {row['tokens']:6d} tokens {row['groups']:3d} groups  step: predicted "
                  f"{row['predicted_step_s']:.3f} s{note}, measured {row['measured_step_s']:.3f} s "
                  f"({_ape(row['predicted_step_s'], row['measured_step_s']):+.1%})  activations: predicted "
                  f"{row['predicted_activation_bytes'] / 2**20:.2f} MiB, measured "
                  f"{row['measured_activation_bytes'] / 2**20:.2f} MiB "
                  f"({_ape(row['predicted_activation_bytes'], row['measured_activation_bytes']):+.2%})", flush=True)
    time_mape = sum(abs(_ape(r["predicted_step_s"], r["measured_step_s"])) for r in rows) / len(rows)
    mem_mape = sum(abs(_ape(r["predicted_activation_bytes"], r["measured_activation_bytes"])) for r in rows) / len(rows)
    if args.json:
        print(json.dumps({"rows": rows, "step_time_mape": time_mape, "memory_mape": mem_mape}, indent=2))
    else:
        print(f"MAPE over {len(rows)} plans: step time {time_mape:.1%}, peak activation memory {mem_mape:.2%}")
    return 0


def _ape(predicted: float, measured: float) -> float:
    """Signed relative error of the prediction."""
    return (predicted - measured) / measured if measured else 0.0
