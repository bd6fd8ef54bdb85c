"""``slimpack plan``: plan one step of a dataset with a strategy and write the plan file."""

from __future__ import annotations

import argparse

from rich.console import Console

from slimpack.cli.common import (
    add_config_arguments,
    add_planner_arguments,
    config_from_args,
    non_negative_int,
    plan_summary,
)
from slimpack.compare.run import check_strategies
from slimpack.config.defaults import PLANNING_CONFIG
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.plan import save_plan
from slimpack.plan.check import check_plan
from slimpack.strategies import STRATEGIES
from slimpack.strategies.stream import PlanStream

HELP = "plan one training step with a strategy and write the plan JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="slimpack", metavar="S",
                        help=f"one of {', '.join(STRATEGIES)} (default slimpack)")
    parser.add_argument("--dataset", default="wikipedia", metavar="D",
                        help="bundled dataset name or a length file (default wikipedia)")
    parser.add_argument("--step", type=non_negative_int, default=0, metavar="I",
                        help="which global batch to plan (default 0); a strategy that holds samples back "
                             "(wlb) replays the steps before it")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("-o", "--output", default="plan.json", metavar="FILE", help="plan file (default plan.json)")
    add_config_arguments(parser, default=PLANNING_CONFIG)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    check_strategies([args.strategy])
    config = config_from_args(args)
    CostModel(config).check_states_fit()
    stream = PlanStream(load_dataset(args.dataset), config, args.strategy, shuffle=args.shuffle, start=args.step)
    planned = next(stream)
    check_plan(planned.plan)
    save_plan(planned.plan, args.output)
    Console(stderr=True).print(f"{plan_summary(planned.plan)}; planned in {planned.planner_time_s:.2f} s "
                               f"-> {args.output}")
    return 0
