"""``slimpack plan``: plan one step of a dataset with a strategy and write the plan file."""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from slimpack.cli.common import add_config_arguments, add_planner_arguments, config_from_args
from slimpack.compare.run import check_strategies, step_batches
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.plan import save_plan
from slimpack.plan.check import check_plan
from slimpack.strategies import STRATEGIES, make_planner

HELP = "plan one training step with a strategy and write the plan JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="slimpack", metavar="S",
                        help=f"one of {', '.join(STRATEGIES)} (default slimpack)")
    parser.add_argument("--dataset", default="wikipedia", metavar="D",
                        help="bundled dataset name or a length file (default wikipedia)")
    parser.add_argument("--step", type=int, default=0, metavar="I", help="which global batch to plan (default 0)")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("-o", "--output", default="plan.json", metavar="FILE", help="plan file (default plan.json)")
    add_config_arguments(parser)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    check_strategies([args.strategy])
    if args.step < 0:
        from slimpack.errors import UserError

        raise UserError(f"--step must be >= 0, got {args.step}")
    config = config_from_args(args)
    CostModel(config).check_states_fit()
    batches = step_batches(load_dataset(args.dataset), config, args.step + 1, shuffle=args.shuffle)
    planner = make_planner(args.strategy, config)
    # strategies that hold samples back carry a queue from step to step: replay the earlier steps
    first = 0 if getattr(planner, "stateful", False) else args.step
    for step in range(first, args.step):
        planner.plan(batches[step], step=step)
    began = time.perf_counter()
    plan = planner.plan(batches[args.step], step=args.step)
    elapsed = time.perf_counter() - began
    check_plan(plan)
    save_plan(plan, args.output)
    groups = sum(len(p.forward) for p in plan.pipelines)
    tokens = sum(s.length for s in plan.samples if s.id not in set(plan.deferred))
    Console(stderr=True).print(
        f"{args.strategy}: step {args.step}, {len(plan.samples)} samples, {tokens:,} tokens, "
        f"{len(plan.pipelines)} pipelines, {groups} forward groups, {len(plan.deferred)} deferred; "
        f"planned in {elapsed:.2f} s -> {args.output}")
    return 0
