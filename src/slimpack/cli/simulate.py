"""``slimpack simulate``: one step of a plan file through the DAG simulator.

Prints step time against the ideal, efficiency, bubble, throughput, MFU, peak memory per stage and
the spread of group times (or the summary as JSON), and optionally writes a Chrome trace, a Gantt
chart and a memory timeline. A plan that fails the checker exits with 1, a malformed file with 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slimpack.cli.common import check_output, plan_summary, positive_int, print_json
from slimpack.errors import UserError
from slimpack.plan import Plan, load_plan
from slimpack.sim import SimResult, save_chrome_trace, simulate
from slimpack.units import GIB

HELP = "simulate one step of a plan file: step time, efficiency, memory; trace and plots on request"
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="plan file (JSON, see docs/plan-format.md)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace (open in ui.perfetto.dev)")
    parser.add_argument("--gantt", metavar="FILE", help="write a Gantt chart of the step (.png, .svg or .pdf)")
    parser.add_argument("--memory", metavar="FILE", help="write live memory per GPU over the step (.png, .svg or .pdf)")
    parser.add_argument("--max-pipelines", type=positive_int, default=8, metavar="N",
                        help="pipelines drawn in the Gantt chart (default 8)")


def _check_output_paths(args: argparse.Namespace) -> None:
    """Refuse a bad output file before spending time on the simulation."""
    for flag in ("gantt", "memory"):
        path = getattr(args, flag)
        if path and Path(path).suffix.lower() not in PLOT_SUFFIXES:
            raise UserError(f"--{flag} {path}: the file name must end in {', '.join(PLOT_SUFFIXES)}")
    for flag in ("trace", "gantt", "memory"):
        if getattr(args, flag):
            check_output(getattr(args, flag), f"--{flag}")


def write_outputs(result: SimResult, args: argparse.Namespace) -> list[str]:
    """Write the files asked for; returns their paths."""
    written = []
    if args.trace:
        save_chrome_trace(result, args.trace)
        written.append(args.trace)
    if args.gantt or args.memory:
        # matplotlib is loaded only when a plot is asked for
        from slimpack.sim.plots import gantt, memory_timeline

        if args.gantt:
            gantt(result, args.gantt, max_pipelines=args.max_pipelines)
            written.append(args.gantt)
        if args.memory:
            memory_timeline(result, args.memory)
            written.append(args.memory)
    return written


def _spread_row(name: str, times: list[float]) -> tuple[str, ...]:
    if not times:
        return (name, "0", "-", "-", "-", "-")
    low, mid, high = min(times), statistics.median(times), max(times)
    return (name, str(len(times)), f"{low * 1e3:.2f}", f"{mid * 1e3:.2f}", f"{high * 1e3:.2f}",
            f"{high / mid:.2f}" if mid > 0 else "-")


def print_report(plan: Plan, result: SimResult, console: Console) -> None:
    console.print(f"[bold]{plan_summary(plan)}[/bold]")
    step = Table(title="step", title_justify="left")
    step.add_column("metric")
    step.add_column("value", justify="right")
    step.add_row("step time", f"{result.step_time_s:.4f} s")
    step.add_row("ideal (perfect balance, no bubble)", f"{result.ideal_time_s:.4f} s")
    step.add_row("efficiency (ideal / step)", f"{result.efficiency:.1%}")
    step.add_row("bubble (idle before the last backward)", f"{result.bubble_fraction:.1%}")
    step.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s")
    step.add_row("MFU", f"{result.mfu:.1%}")
    console.print(step)

    capacity = result.memory_capacity_bytes
    memory = Table(title="peak memory per GPU (highest over pipelines)", title_justify="left")
    for column in ("stage", "peak GiB", "usable GiB", "used", ""):
        memory.add_column(column, justify="right")
    for stage, peak in enumerate(result.peak_memory_bytes):
        verdict = "[bold red]OOM[/bold red]" if peak > capacity else "ok"
        memory.add_row(str(stage), f"{peak / GIB:.1f}", f"{capacity / GIB:.1f}", f"{peak / capacity:.0%}", verdict)
    console.print(memory)

    spread = Table(title="group time on a middle stage, all pipelines (ms)", title_justify="left")
    spread.add_column("pass")
    for column in ("groups", "min", "median", "max", "max/median"):
        spread.add_column(column, justify="right")
    spread.add_row(*_spread_row("forward", [t for p in result.forward_group_times_s for t in p]))
    spread.add_row(*_spread_row("backward", [t for p in result.backward_group_times_s for t in p]))
    console.print(spread)


def run(args: argparse.Namespace) -> int:
    _check_output_paths(args)
    plan = load_plan(args.plan)
    result = simulate(plan)
    written = write_outputs(result, args)
    if args.json:
        print_json(result.summary())
    else:
        print_report(plan, result, Console())
    for path in written:
        # keep stdout pure JSON under --json
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    if result.oom:  # the figures above are still worth reading; the exit code tells scripts
        worst = max(range(len(result.peak_memory_bytes)), key=lambda s: result.peak_memory_bytes[s])
        raise UserError(f"out of memory: stage {worst} needs {result.peak_memory_bytes[worst] / GIB:.1f} GiB, above "
                        f"the usable {result.memory_capacity_bytes / GIB:.1f} GiB")
    return 0
