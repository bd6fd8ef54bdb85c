"""``slimpack lengths``: a length file from a text dataset and a local tokenizer (logic in
``slimpack.data.count_tokens``)."""

from __future__ import annotations

import argparse

from rich.console import Console

from slimpack.cli.common import check_output
from slimpack.data.count_tokens import DEFAULT_TEXT_COLUMN, count_tokens
from slimpack.data.loaders import WRITABLE_SUFFIXES, check_length_file_name, save_lengths

HELP = "count the tokens of each document of a local text dataset with a local tokenizer: a length file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE",
                        help="a Hugging Face datasets directory (save_to_disk), or a .jsonl or .parquet file of texts")
    parser.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="local tokenizer: a directory holding tokenizer.json, or the file (nothing is downloaded)")
    parser.add_argument("--text-column", metavar="NAME",
                        help=f"column or key holding the text (default {DEFAULT_TEXT_COLUMN}, or the only text column)")
    parser.add_argument("--split", metavar="NAME", help="split of a DatasetDict directory (default train, or the only one)")
    parser.add_argument("--no-special-tokens", dest="special_tokens", action="store_false",
                        help="do not count the special tokens (BOS/EOS) the tokenizer adds to each document")
    parser.add_argument("-o", "--output", default="lengths.npy", metavar="FILE",
                        help=f"length file to write ({', '.join(WRITABLE_SUFFIXES)}; default lengths.npy), "
                             f"for --dataset of the other commands")


def run(args: argparse.Namespace) -> int:
    check_length_file_name(args.output)
    check_output(args.output, "--output")
    counts = count_tokens(args.source, args.tokenizer, text_column=args.text_column, split=args.split,
                          special_tokens=args.special_tokens)
    save_lengths(counts.lengths, args.output)
    empty = f"; {counts.num_empty} empty document(s) skipped" if counts.num_empty else ""
    Console(stderr=True).print(
        f"{counts.lengths.size:,} documents, {int(counts.lengths.sum()):,} tokens (column {counts.text_column!r}, "
        f"longest {int(counts.lengths.max()):,}){empty} -> {args.output}", highlight=False)
    return 0
