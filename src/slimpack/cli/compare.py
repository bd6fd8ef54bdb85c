"""``slimpack compare``: the main job. Which strategy wins on your data, model and cluster, by how
much, and why (table, JSON, and a report with charts)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from slimpack.cli.common import (
    add_config_arguments,
    add_planner_arguments,
    config_from_args,
    positive_int,
)
from slimpack.compare import compare
from slimpack.compare.run import check_strategies
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.strategies import STRATEGIES

HELP = "plan and simulate consecutive steps with several strategies and compare them side by side"

# Bundled defaults: a long-tailed real dataset and a layout that fits llama2-7b at 128K context in
# an H100's memory for every strategy (tp 8 x pp 4 x dp 2 = 64 GPUs, as WLB-LLM's 7B runs).
DEFAULT_DATASET = "wikipedia"
DEFAULT_CONFIG = build_config(model="llama2-7b", gpu="h100-sxm", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                              train=TrainConfig(max_context=131072, global_batch_tokens=4 * 2**20))
DEFAULT_STEPS = 4
GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default=DEFAULT_DATASET, metavar="D",
                        help=f"bundled dataset name or a length file (default {DEFAULT_DATASET})")
    parser.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS, metavar="S",
                        help=f"consecutive steps to plan and simulate (default {DEFAULT_STEPS})")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), metavar="A,B,...",
                        help=f"comma-separated strategies (default all: {','.join(STRATEGIES)})")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("--json", metavar="FILE", help="write the per-strategy figures as JSON ('-' for stdout)")
    parser.add_argument("--report", metavar="DIR", help="write report.md, report.html and charts into DIR")
    add_config_arguments(parser)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    check_strategies(strategies)
    config = config_from_args(args, default=DEFAULT_CONFIG)
    CostModel(config).check_states_fit()  # before the progress bar, so the error is one clean line
    dataset = load_dataset(args.dataset)
    console = Console(stderr=args.json == "-")
    if not console.is_terminal:
        console = Console(stderr=args.json == "-", width=170)  # logs and CI: do not squeeze the table
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("planning and simulating", total=len(strategies) * args.steps)
        comparison = compare(config, dataset, strategies, args.steps, shuffle=args.shuffle,
                             on_step=lambda: progress.advance(task))
    rows = comparison.table()
    console.print(_table(rows, config, dataset.name, args.steps))
    for row in rows:
        if row["failed_steps"]:
            console.print(f"[red]{row['strategy']} failed on step(s) {row['failed_steps']}: "
                          f"{'; '.join(row['errors'])}")
    if args.json:
        text = json.dumps({"dataset": dataset.name, "config": config.to_dict(), "steps": args.steps,
                           "strategies": rows}, indent=2)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            Path(args.json).write_text(text + "\n")
    if args.report:
        from slimpack.compare.report import write_report

        path = write_report(comparison, Path(args.report), command=["slimpack", *args.argv])
        console.print(f"report: {path}")
    return 0


def _tokens(count: int) -> str:
    """4194304 -> '4M', 262144 -> '256K'."""
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if count >= scale and count % (scale // 4) == 0:
            return f"{count / scale:g}{unit}"
    return f"{count:,}"


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(value * scale, spec)


def _table(rows: list[dict], config, dataset: str, steps: int) -> Table:
    par = config.parallel
    table = Table(title=f"{dataset}: {config.model.name} on {par.num_devices}x {config.cluster.name} "
                        f"(tp {par.tp}, pp {par.pp}, dp {par.dp}, cp {par.cp}), {config.train.max_context // 1024}K context, "
                        f"{_tokens(config.train.global_batch_tokens)}-token batches, {steps} steps")
    for name, justify in (("strategy", "left"), ("tokens/s", "right"), ("step mean", "right"),
                          ("step p95", "right"), ("vs fixed", "right"), ("efficiency", "right"),
                          ("bubble", "right"), ("peak mem / cap", "right"), ("OOM steps", "right"),
                          ("plan p50", "right"), ("delay/token", "right")):
        table.add_column(name, justify=justify)
    best = max((r["tokens_per_s"] for r in rows), default=0)
    for r in rows:
        if r["efficiency"] is None:
            table.add_row(r["strategy"], "failed", *[""] * 9, style="red")
            continue
        style = "bold green" if r["tokens_per_s"] == best and best > 0 else ""
        table.add_row(
            r["strategy"], f"{r['tokens_per_s']:,.0f}", _fmt(r["step_time_mean_s"], ".2f") + " s",
            _fmt(r["step_time_p95_s"], ".2f") + " s", _fmt(r["speedup_vs_fixed"], ".2f") + "x",
            _fmt(r["efficiency"], ".3f"), _fmt(r["bubble_fraction"], ".1f", 100) + "%",
            f"{r['peak_memory_bytes'] / GIB:.1f} / {(r['memory_capacity_bytes'] or 0) / GIB:.1f} GiB",
            str(len(r["oom_steps"])), _fmt(r["planner_time_p50_s"], ".2f") + " s",
            f"{r['mean_delay_steps_per_token']:.2f}", style=style)
    return table
