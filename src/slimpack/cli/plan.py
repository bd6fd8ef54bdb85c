"""``slimpack plan``: plan one step of a dataset with a strategy and write the plan file."""

from __future__ import annotations

import argparse

from rich.console import Console

from slimpack.api import plan_step
from slimpack.cli.common import (
    add_config_arguments,
    add_dataset_arguments,
    add_planner_arguments,
    check_output,
    config_for_dataset,
    context_note,
    dataset_from_args,
    non_negative_int,
    plan_summary,
)
from slimpack.config.defaults import PLANNING_CONFIG
from slimpack.plan import save_plan
from slimpack.strategies import STRATEGIES

HELP = "plan one training step with a strategy and write the plan JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="slimpack", metavar="S",
                        help=f"one of {', '.join(STRATEGIES)} (default slimpack)")
    add_dataset_arguments(parser)
    parser.add_argument("--step", type=non_negative_int, default=0, metavar="I",
                        help="which global batch to plan (default 0); a strategy that holds samples back "
                             "(wlb) replays the steps before it")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("-o", "--output", default="plan.json", metavar="FILE", help="plan file (default plan.json)")
    add_config_arguments(parser, default=PLANNING_CONFIG)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    dataset = dataset_from_args(args)
    config = config_for_dataset(args, dataset)
    check_output(args.output, "--output")
    planned = plan_step(dataset, config, args.strategy, step=args.step, shuffle=args.shuffle)
    save_plan(planned.plan, args.output)
    console = Console(stderr=True)
    console.print(context_note(dataset, config), highlight=False)
    console.print(f"{plan_summary(planned.plan)}; planned in {planned.planner_time_s:.2f} s -> {args.output}")
    return 0
