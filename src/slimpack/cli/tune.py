"""``slimpack tune``: the best layout of each strategy on a GPU budget (logic in ``slimpack.tune``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from slimpack.cli.common import (
    add_cut_documents_argument,
    add_dataset_arguments,
    add_planner_arguments,
    check_json_and_report,
    check_output,
    config_from_args,
    context_note,
    dataset_from_args,
    non_negative_float,
    non_negative_int,
    positive_int,
)
from slimpack.compare import Window
from slimpack.compare.run import DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS
from slimpack.config import CLUSTER_PRESETS, MODEL_PRESETS, build_config, save_config
from slimpack.files import output_path
from slimpack.strategies import STRATEGIES
from slimpack.tune import tune
from slimpack.tune.report import best_rows, protocol, search_summary, to_json, write_report
from slimpack.tune.search import CONFIRM, CONFIRM_WITHIN, DEFERRING_CONFIRM_WITHIN
from slimpack.tune.trials import MAX_DEFAULT_WORKERS, default_workers

HELP = "search tp/pp/vpp/stage split/cp/dp/recomputation for each strategy's best layout on N GPUs"
TIME_LIMIT_HELP = (
    "end in about this many seconds (an estimate: a trial running is never cut): screening gets at least half, the "
    "most promising layouts first (each tp tried early, then the tp whose layouts came nearest their floors), then "
    "stops once the rest is what each strategy's best front runner needs to run the window; the other front runners "
    "run it only where they end in time; the layouts and front runners left out are reported, with the most the "
    "left layouts' floors allow (default: no limit, the exact search)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=positive_int, required=True, metavar="N", help="GPUs to lay out")
    parser.add_argument("--config", metavar="FILE", help="base config (model, cluster, batch, planner); its layout is searched")
    parser.add_argument("--model", metavar="M", help=f"model preset ({', '.join(MODEL_PRESETS)}) or config.json")
    parser.add_argument("--gpu", metavar="G", help=f"GPU/cluster preset ({', '.join(CLUSTER_PRESETS)})")
    add_dataset_arguments(parser)
    parser.add_argument("--max-context", type=positive_int, metavar="N", help="longest sample in tokens (e.g. 128K)")
    parser.add_argument("--global-batch-tokens", type=positive_int, metavar="N", help="tokens per global batch (e.g. 4M)")
    parser.add_argument("--micro-batch-tokens", type=positive_int, metavar="N",
                        help="most tokens a baseline packs into one micro-batch, the smallest cap tried (default: the "
                             "max context); larger caps memory allows are tried as layouts of their own")
    parser.add_argument("--seed", type=int, help="seed for batch sampling")
    add_cut_documents_argument(parser)
    parser.add_argument("--strategies", default=",".join(STRATEGIES), metavar="A,B,...",
                        help=f"comma-separated strategies (default all: {','.join(STRATEGIES)})")
    parser.add_argument("--screen-steps", type=positive_int, default=1, metavar="S",
                        help="consecutive steps each layout is screened over (default 1)")
    parser.add_argument("--confirm", type=non_negative_int, default=CONFIRM, metavar="K",
                        help=f"front runners per strategy and micro-batch cap (within {CONFIRM_WITHIN * 100:.0f}%% of its best "
                             f"screened; {DEFERRING_CONFIRM_WITHIN * 100:.0f}%% for wlb, which defers samples) re-run "
                             f"over the warm-up and window below; the best there wins, and one that fails there no "
                             f"longer prunes the rest (default {CONFIRM}; 0: screening figures only)")
    parser.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP_STEPS, metavar="W",
                        help=f"unmeasured steps before the confirmation window (default {DEFAULT_WARMUP_STEPS})")
    parser.add_argument("--steps", type=positive_int, default=DEFAULT_WINDOW_STEPS, metavar="S",
                        help=f"measured confirmation window, as in compare (default {DEFAULT_WINDOW_STEPS})")
    workers = default_workers()
    parser.add_argument("--time-limit", type=non_negative_float, metavar="SECONDS", help=TIME_LIMIT_HELP)
    parser.add_argument("--workers", type=positive_int, default=workers, metavar="N",
                        help=f"worker processes running layouts; the results are the same for any number (default: "
                             f"one per CPU this process may use, at most {MAX_DEFAULT_WORKERS}: here {workers})")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON ('-' for stdout)")
    parser.add_argument("--report", metavar="DIR", help="write tune.md, tune.json, tune.png and best-<strategy>.json")
    parser.add_argument("--output", metavar="FILE", default="tune-config.json",
                        help="the winning config, for --config of plan/compare/train (default tune-config.json)")
    add_planner_arguments(parser)
    # the layout and recomputation are what tune searches: config_from_args leaves the base's
    parser.set_defaults(tp=None, pp=None, dp=None, cp=None, vpp=None, recompute=None, config_default=build_config())


def run(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    base = config_from_args(args)
    dataset = dataset_from_args(args)
    check_output(args.output, "--output")
    check_json_and_report(args)
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("enumerating layouts", total=None)
        result = tune(base, dataset, args.gpus, strategies, screen_steps=args.screen_steps, confirm=args.confirm,
                      window=Window(warmup_steps=args.warmup, steps=args.steps), workers=args.workers,
                      time_limit_s=args.time_limit,
                      on_screen_total=lambda n: progress.update(task, total=n),
                      on_trial=lambda name, trial: progress.update(task, advance=trial.phase == "screen",
                                                                   description=f"{trial.phase}: {name}"))
    out = Console(stderr=args.json == "-", width=200 if not sys.stdout.isatty() else None)
    out.print(_table(best_rows(result), result))
    out.print(context_note(dataset, base), highlight=False)
    for line in search_summary(result):
        out.print(line, highlight=False)
    winner = result.best_config()
    if winner is not None:
        save_config(winner, args.output)
        out.print(f"winning config: {args.output} (use it with --config in plan, compare or train)")
    if args.json:
        text = json.dumps(to_json(result), indent=2) + "\n"
        sys.stdout.write(text) if args.json == "-" else output_path(args.json).write_text(text)
    if args.report:
        out.print(f"report: {write_report(result, Path(args.report), ['slimpack', *args.argv])}")
    return 0


def _table(rows: list[dict], result) -> Table:
    base = result.base
    skipped = sum(result.skipped.values())
    table = Table(title=f"{result.dataset}: {base.model.name} on {result.num_gpus}x {base.cluster.name}, "
                        f"{base.train.max_context // 1024}K context; {protocol(result, 'screen')}"
                        f"{'; front runners confirmed over ' + result.window.describe() if result.window else ''}; "
                        f"{skipped} layouts cannot hold the model; {result.wall_s:.0f} s (simulated)")
    limited = result.time_limit_s is not None
    for name in ("strategy", "best layout", "tokens/s", "efficiency", "vs fixed's best", "from", "simulated", "pruned",
                 "failed", *(("not screened",) if limited else ())):
        table.add_column(name, justify="left" if name in ("strategy", "best layout") else "right")
    top = max((r["tokens_per_s"] for r in rows), default=0)
    for r in rows:
        ratio = f"{r['vs_best_fixed']:.2f}x" if r["vs_best_fixed"] else "—"
        table.add_row(r["strategy"], r["layout"] or "none fits", f"{r['tokens_per_s']:,.0f}",
                      f"{r['efficiency']:.3f}" if r["efficiency"] else "—", ratio,
                      r["protocol"].split(":")[0] if r["protocol"] else "—", str(r["simulated"]),
                      str(r["pruned"]), str(r["failed"]), *((str(r["not_screened"]),) if limited else ()),
                      style="bold green" if r["tokens_per_s"] == top and top else "")
    return table
