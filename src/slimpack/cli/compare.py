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

from slimpack.api import compare
from slimpack.cli.common import (
    add_config_arguments,
    add_dataset_arguments,
    add_planner_arguments,
    check_json_and_report,
    config_for_dataset,
    context_note,
    dataset_from_args,
    non_negative_int,
    positive_int,
)
from slimpack.compare import Window
from slimpack.compare.row import COLUMNS, StrategyRow, cells, cut_document_notes, drain_notes
from slimpack.compare.run import DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS, check_strategies
from slimpack.config import Config
from slimpack.config.defaults import PLANNING_CONFIG
from slimpack.cost import CostModel
from slimpack.cost.stages import split_gain
from slimpack.data import Dataset
from slimpack.files import output_path
from slimpack.strategies import STRATEGIES
from slimpack.strategies.stream import stream_batches
from slimpack.units import MIB

HELP = "plan and simulate consecutive steps with several strategies and compare them side by side"
DEFAULT_DATASET = "wikipedia"
STAGE_NOTE_GAIN = 0.01
"""How much faster the slowest stage must get under the balanced split for compare to say so."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataset_arguments(parser, default=DEFAULT_DATASET)
    parser.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP_STEPS, metavar="W",
                        help=f"unmeasured steps first, which fill deferring strategies' queues "
                             f"(default {DEFAULT_WARMUP_STEPS})")
    parser.add_argument("--steps", type=positive_int, default=DEFAULT_WINDOW_STEPS, metavar="S",
                        help=f"measured window: consecutive steps after the warm-up; work deferred past it "
                             f"is drained and reported apart (default {DEFAULT_WINDOW_STEPS})")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), metavar="A,B,...",
                        help=f"comma-separated strategies (default all: {','.join(STRATEGIES)})")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("--json", metavar="FILE", help="write the per-strategy figures as JSON ('-' for stdout)")
    parser.add_argument("--report", metavar="DIR", help="write report.md, report.html and charts into DIR")
    add_config_arguments(parser, default=PLANNING_CONFIG)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    check_strategies(strategies)
    check_json_and_report(args)
    dataset = dataset_from_args(args)
    config = config_for_dataset(args, dataset)
    CostModel(config).check_states_fit()  # before the progress bar, so the error is one clean line
    window = Window(warmup_steps=args.warmup, steps=args.steps)
    console = Console(stderr=args.json == "-")
    if not console.is_terminal:
        console = Console(stderr=args.json == "-", width=170)  # logs and CI: do not squeeze the table
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("planning and simulating", total=len(strategies) * window.end_step)
        comparison = compare(dataset, config, strategies, warmup=args.warmup, steps=args.steps,
                             shuffle=args.shuffle, on_step=lambda: progress.advance(task))
    rows = comparison.table()
    console.print(_table(rows, config, dataset.name, window))
    console.print(context_note(dataset, config), highlight=False)
    for note in [*drain_notes(rows), *cut_document_notes(rows), *_stage_notes(config, dataset)]:
        console.print(note, highlight=False)
    for row in rows:
        if row.failed_steps:
            console.print(f"[red]{row.strategy} failed on step(s) {list(row.failed_steps)}: {'; '.join(row.errors)}")
    if args.json:
        text = json.dumps({"dataset": dataset.name, "config": config.to_dict(), "window": window.to_dict(),
                           "context_cut": comparison.context_cut.to_dict(), "strategies": [row.to_dict() for row in rows]}, indent=2)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            output_path(args.json).write_text(text + "\n")
    if args.report:
        from slimpack.compare.report import write_report

        path = write_report(comparison, Path(args.report), command=["slimpack", *args.argv])
        console.print(f"report: {path}")
    return 0


def _stage_notes(config: Config, dataset: Dataset) -> list[str]:
    """A sentence where another split of the layers would make the slowest pipeline stage at least
    ``STAGE_NOTE_GAIN`` faster (the LM head of a large vocabulary weighs on the last stage: llama3-8b
    on pp 4 carries 3.7% more on its slowest stage evenly split than 8/8/9/7 on a wikipedia batch)."""
    if config.parallel.pp == 1:
        return []
    split, ratio = split_gain(config, [sample.length for sample in stream_batches(dataset, config, 1)[0]])
    if ratio > 1 - STAGE_NOTE_GAIN:
        return []
    own = "/".join(map(str, config.parallel.stage_layers)) or "even"
    return [f"pipeline stages: the slowest stage's work is {1 / ratio - 1:.1%} more with the {own} layer split than "
            f"with --stage-layers balanced ({'/'.join(map(str, split))}, weighed by the first batch)"]


def _tokens(count: int) -> str:
    """4194304 -> '4M', 262144 -> '256K'."""
    for unit, scale in (("M", MIB), ("K", 2**10)):
        if count >= scale and count % (scale // 4) == 0:
            return f"{count / scale:g}{unit}"
    return f"{count:,}"


def _table(rows: list[StrategyRow], config: Config, dataset: str, window: Window) -> Table:
    par = config.parallel
    table = Table(title=f"{dataset}: {config.model.name} on {par.num_devices}x {config.cluster.name} "
                        f"(tp {par.tp}, pp {par.pp}, dp {par.dp}, cp {par.cp}), {config.train.max_context // 1024}K context, "
                        f"{_tokens(config.train.global_batch_tokens)}-token batches; {window.describe()}")
    for header, _ in COLUMNS:
        table.add_column(header, justify="left" if header == "strategy" else "right")
    best = max((r.tokens_per_s for r in rows), default=0)
    for r in rows:
        style = "red" if not r.ran else ("bold green" if r.tokens_per_s == best and best > 0 else "")
        table.add_row(*cells(r), style=style)
    return table
