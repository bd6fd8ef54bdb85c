"""``slimpack datasets``: statistics of the bundled datasets, or of given length files / names."""

from __future__ import annotations

import argparse
import sys

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from slimpack.cli.common import positive_int, print_json
from slimpack.config.defaults import PLANNING_CONFIG
from slimpack.data import LONG_DOC_TOKENS, Dataset, bundled_datasets, context_cut, load_dataset

HELP = "show length statistics of the bundled datasets, or of given length files or names"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("datasets", nargs="*", metavar="PATH_OR_NAME",
                        help=f"length files (.csv .txt .jsonl .npy .npz .parquet), bundled names "
                             f"({', '.join(bundled_datasets())}) or 'synthetic[:k=v,...]'; "
                             f"default: every bundled dataset")
    parser.add_argument("--column", metavar="NAME",
                        help="column (CSV/Parquet) or key (JSONL) holding the length in the files given")
    parser.add_argument("--max-context", type=positive_int, default=PLANNING_CONFIG.train.max_context,
                        metavar="N", help=f"count the documents longer than this context, which planning "
                                          f"cuts into chunks (default {PLANNING_CONFIG.train.max_context})")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of objects (name, count, total_tokens, mean, median, "
                             "p99, max, share_tokens_over_32k, max_context, docs_over_context, source)")


def run(args: argparse.Namespace) -> int:
    names = args.datasets or list(bundled_datasets())
    # Load everything before printing, so a bad file fails cleanly with no half-printed table.
    datasets = [load_dataset(name, column=args.column) for name in names]
    if args.json:
        print_json([dataset.summary(args.max_context) for dataset in datasets])
    else:
        _print_table(datasets, args.max_context)
    return 0


def _print_table(datasets: list[Dataset], max_context: int) -> None:
    # Sources go below the table: as a column they squeeze the numbers on an 80-column terminal.
    console = Console(file=sys.stdout)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("name", overflow="fold", min_width=9)
    for header in ("count", "tokens", "mean", "median", "p99", "max", f">{LONG_DOC_TOKENS // 1024}K", "cut"):
        table.add_column(header, justify="right", no_wrap=True)
    for dataset in datasets:
        stats = dataset.stats
        table.add_row(
            dataset.name, f"{stats.count:,}", _compact(stats.total_tokens), f"{stats.mean:,.1f}",
            _number(stats.median), f"{stats.p99:,.1f}", f"{stats.max:,}",
            f"{stats.share_tokens_over_32k:.1%}", f"{context_cut(dataset.lengths, max_context).num_cut_docs:,}")
    console.print(table)
    console.print(f"lengths in tokens; >{LONG_DOC_TOKENS // 1024}K: share of tokens in documents "
                  f"longer than {LONG_DOC_TOKENS} tokens; cut: documents longer than the {max_context}-token "
                  f"context (--max-context), cut into chunks when planning; p99 interpolated", highlight=False)
    for dataset in datasets:
        console.print(f"[bold]{escape(dataset.name)}[/bold]: {escape(dataset.source)}", highlight=False)


def _number(value: float) -> str:
    """Integers as such, other values with one decimal (a median can be a midpoint)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _compact(value: int) -> str:
    for scale, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return str(value)
