"""``slimpack validate``: read a plan file and run the plan checker on it.

Exit 0 with a one-line summary for a valid plan, 1 for a plan that breaks a rule (the checker's
message names the entry), 2 for a file that is not a plan at all (unreadable, bad JSON, bad shape).
"""

from __future__ import annotations

import argparse

from slimpack.cli.common import plan_summary
from slimpack.plan import load_plan
from slimpack.plan.check import check_plan

HELP = "check a plan file: coverage of every token, slice order, schedule completeness, no deadlock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="plan file (JSON, see docs/plan-format.md)")


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    # the cost model gives the default schedule the memory cap the simulator runs it with
    check_plan(plan)
    print(f"{args.plan}: valid plan: {plan_summary(plan)}")
    return 0
