"""Flags shared by several commands (model, cluster and layout, so every command spells them alike)
and output helpers they share."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from slimpack.api import balance_stages, configure
from slimpack.config import CLUSTER_PRESETS, MODEL_PRESETS, Config, PlannerConfig
from slimpack.config.efficiency import EFFICIENCY_PRESETS
from slimpack.config.hf import is_hf_config
from slimpack.data import SUFFIXES, Dataset, bundled_datasets, context_cut, load_dataset
from slimpack.errors import UserError
from slimpack.plan import Plan


def _count(text: str, minimum: int) -> int:
    """An integer with an optional K/M/G suffix (64K = 65536), at least ``minimum``."""
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    multipliers = {"k": 2**10, "m": 2**20, "g": 2**30}
    raw = text.strip().lower()
    scale = multipliers.get(raw[-1:], 1)
    digits = raw[:-1] if scale != 1 else raw
    try:
        value = int(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted} (e.g. 65536 or 64K), got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1; accepts K/M/G suffixes (64K = 65536)."""
    return _count(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0; accepts K/M/G suffixes (120K = 122880)."""
    return _count(text, 0)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (refuses nan, inf, 0 and negatives)."""
    return _number(text, zero=False)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (refuses nan, inf and negatives)."""
    return _number(text, zero=True)


def stage_split(text: str) -> tuple[int, ...] | str:
    """argparse type of --stage-layers: 'even', 'balanced' or layers per pipeline chunk (9,8,8,7)."""
    if text in ("even", "balanced"):
        return text
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        layers = ()
    if not layers or min(layers) < 1:
        raise argparse.ArgumentTypeError(f"expected 'even', 'balanced' or layers per pipeline chunk, each >= 1, "
                                         f"such as 9,8,8,7; got {text!r}")
    return layers


def _number(text: str, *, zero: bool) -> float:
    wanted = "a number >= 0" if zero else "a positive number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        raise argparse.ArgumentTypeError(f"expected a finite number {'>= 0' if zero else '> 0'}, got {text!r}")
    return value


def add_config_arguments(parser: argparse.ArgumentParser, *, default: Config, training: bool = True) -> None:
    """--config, --model, --gpu, --tp/--pp/--dp/--cp/--vpp and (with ``training``) context and batch.
    Flags override ``--config``, which replaces ``default``; ``--help`` shows the default's values."""
    parser.set_defaults(config_default=default)
    par, train = default.parallel, default.train
    group = parser.add_argument_group(
        "model, cluster and layout",
        f"default: {default.model.name} on {default.cluster.name}, tp {par.tp} pp {par.pp} dp {par.dp} cp {par.cp}"
        + (f", max context {train.max_context}, {train.global_batch_tokens} tokens per batch, "
           f"recompute {train.recompute}" if training else ""))
    group.add_argument("--config", metavar="FILE", help="JSON or TOML config file; flags given here override it")
    group.add_argument("--model", metavar="M",
                       help=f"model preset ({', '.join(MODEL_PRESETS)}) or a Hugging Face config.json (file or "
                            f"checkpoint directory); default {default.model.name}")
    group.add_argument("--gpu", metavar="G",
                       help=f"GPU/cluster preset ({', '.join(CLUSTER_PRESETS)}); default {default.cluster.name}")
    for name, text in (("tp", "tensor"), ("pp", "pipeline"), ("dp", "data"), ("cp", "context")):
        group.add_argument(f"--{name}", type=positive_int, metavar="N",
                           help=f"{text}-parallel degree (default {getattr(par, name)})")
    group.add_argument("--vpp", type=positive_int, metavar="N",
                       help=f"virtual stages per pipeline stage, interleaved 1F1B (default {par.virtual_stages})")
    group.add_argument("--kernels", choices=sorted(EFFICIENCY_PRESETS),
                       help="attention-kernel family whose efficiency figures the cost model uses (default fa3)")
    if training:
        add_stage_layers_argument(group)
        group.add_argument("--max-context", type=positive_int, metavar="N",
                           help=f"longest sample in tokens, e.g. 64K (default {train.max_context})")
        group.add_argument("--global-batch-tokens", type=positive_int, metavar="N",
                           help=f"tokens per global batch, e.g. 4M (default {train.global_batch_tokens})")
        group.add_argument("--micro-batch-tokens", type=positive_int, metavar="N",
                           help="most tokens a baseline packs into one micro-batch, e.g. 16K (default: the max "
                                "context; SlimPack and SlimPipe ignore it)")
        group.add_argument("--recompute", choices=("none", "selective", "full"),
                           help=f"activation recomputation (default {train.recompute})")
        group.add_argument("--seed", type=int, help=f"seed for batch sampling (default {train.seed})")
        add_cut_documents_argument(group)


def add_stage_layers_argument(parser: Any) -> None:
    """--stage-layers on a parser or an argument group (``ParallelConfig.stage_layers``; None unless given)."""
    parser.add_argument("--stage-layers", type=stage_split, metavar="SPLIT",
                        help="transformer layers of each pipeline chunk in layer order (with --vpp, chunk c of stage s "
                             "is entry c*pp+s), e.g. 9,8,8,7; 'balanced': the split that evens out the stages' work "
                             "with the embedding on the first and the LM head on the last, weighed by the first batch "
                             "where the command plans a dataset (else by context-length samples); 'even' (default, "
                             "unless --config gives one)")


def add_cut_documents_argument(parser: Any) -> None:
    """--cut-documents / --no-cut-documents on a parser or an argument group (``TrainConfig.cut_documents``;
    None unless given)."""
    parser.add_argument("--cut-documents", action=argparse.BooleanOptionalAction, default=None,
                        help="cut documents where fixed-length sequences of --max-context tokens end (as Megatron's "
                             "fixed-length packing does) and train each piece on its own: every strategy then trains "
                             "the pieces fixed and slimpipe train (default off: whole documents)")


def add_dataset_arguments(parser: argparse.ArgumentParser, *, default: str = "wikipedia",
                          extra: str = "") -> None:
    """--dataset and --column, spelled alike by every command that reads lengths."""
    parser.add_argument("--dataset", default=default, metavar="D",
                        help=f"{extra}bundled dataset ({', '.join(bundled_datasets())}), 'synthetic[:k=v,...]' or a "
                             f"length file ({' '.join(SUFFIXES)}; `slimpack lengths` makes one from text); "
                             f"default {default}")
    parser.add_argument("--column", metavar="NAME",
                        help="in a length file: the column (CSV/Parquet) or key (JSONL) holding lengths or token "
                             "lists (default: a known name such as length, num_tokens or input_ids, or the only column)")


def dataset_from_args(args: argparse.Namespace) -> Dataset:
    return load_dataset(args.dataset, column=args.column)


def context_note(dataset: Dataset, config: Config) -> str:
    """The line every command that plans from lengths prints: what the context did to the documents."""
    pieces = ("; documents cut where fixed-length sequences end (--cut-documents): every strategy trains "
              "those pieces" if config.train.cut_documents else "")
    return f"{dataset.name}: {context_cut(dataset.lengths, config.train.max_context).describe()}{pieces}"


PLANNER_SWITCHES = (("slicing", "use_slicing", "cut long samples into slices"),
                    ("asymmetric", "use_asymmetric", "regroup backward work on backward cost"),
                    ("dp-merge", "use_dp_merge", "merge replicas into a CP group for outliers"),
                    ("wide-merge", "use_wide_merge", "plan the whole batch on merged replicas where memory is tight"),
                    ("milp", "use_milp", "refine the heuristic with the HiGHS MILP"),
                    ("cost-balance", "use_cost_balance", "balance replicas on cost (off: on tokens)"),
                    ("lookahead", "use_lookahead", "try running forwards ahead of 1F1B"))


def add_planner_arguments(parser: argparse.ArgumentParser) -> None:
    """SlimPack's switches (--no-slicing, --milp, ...) and its MILP time limit."""
    group = parser.add_argument_group("SlimPack planner switches (for ablations)")
    defaults = PlannerConfig()
    for flag, field, text in PLANNER_SWITCHES:
        # None unless given: a --config file's setting stands unless a flag overrides it
        group.add_argument(f"--{flag}", dest=field, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{text} (default: {'on' if getattr(defaults, field) else 'off'})")
    group.add_argument("--milp-time-limit", type=positive_float, metavar="SECONDS", dest="milp_time_limit_s",
                       help="wall-clock limit of the MILP refinement per plan (with --milp)")


def config_from_args(args: argparse.Namespace) -> Config:
    """Start from --config (or the command's default) and apply the flags that were given."""
    training = {name: getattr(args, name, None)
                for name in ("max_context", "global_batch_tokens", "micro_batch_tokens", "recompute", "seed",
                             "cut_documents")}
    planner = {field: getattr(args, field, None) for _, field, _ in PLANNER_SWITCHES}
    planner["milp_time_limit_s"] = getattr(args, "milp_time_limit_s", None)
    return configure(args.config or args.config_default, model=args.model, gpu=args.gpu, tp=args.tp, pp=args.pp,
                     dp=args.dp, cp=args.cp, vpp=args.vpp, stage_layers=getattr(args, "stage_layers", None),
                     kernels=getattr(args, "kernels", None),
                     planner={k: v for k, v in planner.items() if v is not None}, **training)


def config_for_dataset(args: argparse.Namespace, dataset: Dataset) -> Config:
    """``config_from_args`` for a command that plans ``dataset``: ``--stage-layers balanced`` weighs
    the stages' work by the first batch of its step stream (``api.balance_stages``), as tune does."""
    config = config_from_args(args)
    return balance_stages(config, dataset) if getattr(args, "stage_layers", None) == "balanced" else config


def check_output(path: str, flag: str, *, directory: bool = False) -> None:
    """Refuse an output path that cannot be written, before the work starts. It creates nothing: the
    writes make the folders the path names (``slimpack.files.output_path``)."""
    target = Path(path)
    if target.exists() and target.is_dir() != directory:
        raise UserError(f"{flag} {path}: {'not a directory' if directory else 'is a directory'}")
    probe = target if target.is_dir() else target.parent
    while not probe.exists():  # the folders that will be made: probe the first one that exists
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{flag} {path}: cannot write there ({probe} is a file, where the path needs a folder)")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write there ({exc.strerror})") from None
    if target.is_file() and not os.access(target, os.W_OK):
        raise UserError(f"{flag} {path}: the file is read-only")


def check_json_and_report(args: argparse.Namespace) -> None:
    """``--json FILE`` (``-`` is stdout) and ``--report DIR`` of compare and tune, checked before the work."""
    if args.json and args.json != "-":
        check_output(args.json, "--json")
    if args.report:
        check_output(args.report, "--report", directory=True)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def plan_summary(plan: Plan) -> str:
    """One line: what the plan runs and on what."""
    par = plan.config.parallel
    deferred = plan.deferred
    scheduled = plan.trained_samples
    forward = sum(len(p.forward) for p in plan.pipelines)
    backward = sum(len(p.backward) for p in plan.pipelines)
    late = f" ({len(deferred)} deferred)" if deferred else ""
    vpp = f" vpp={par.virtual_stages}" if par.virtual_stages > 1 else ""
    split = f", layers per chunk {'/'.join(map(str, par.stage_layers))}" if par.stage_layers else ""
    return (f"strategy {plan.strategy}, step {plan.step}: {len(plan.pipelines)} pipeline(s) on "
            f"tp={par.tp} pp={par.pp}{vpp} dp={par.dp} cp={par.cp} ({par.num_devices} GPUs){split}, "
            f"{forward} forward / {backward} backward groups, {len(scheduled)} samples{late}, "
            f"{sum(s.length for s in scheduled)} tokens")


__all__ = ["add_config_arguments", "add_cut_documents_argument", "add_dataset_arguments", "check_json_and_report",
           "check_output", "config_for_dataset", "config_from_args", "context_note", "dataset_from_args", "hf_config_arg", "non_negative_int", "plan_summary",
           "positive_float", "positive_int", "print_json", "runtime_config_from_args", "stage_split"]


def hf_config_arg(args: argparse.Namespace) -> str | None:
    """``--model`` when it names a Hugging Face config.json (the runtime then runs transformers' model)."""
    return args.model if args.model and is_hf_config(args.model) else None


def runtime_config_from_args(args: argparse.Namespace) -> Config:
    """``config_from_args`` for the commands that run the runtime, as it runs the ``--model``
    (``runtime.models.as_run``; torch is imported only here)."""
    from slimpack.runtime.models import as_run

    return as_run(config_from_args(args), hf_config_arg(args))
