"""``slimpack cost``: FLOPs, time and activation memory of one slice, per layer and for the model."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console
from rich.table import Table

from slimpack.cli.common import (
    add_config_arguments,
    config_from_args,
    non_negative_int,
    positive_int,
    print_json,
)
from slimpack.config.defaults import PLANNING_CONFIG
from slimpack.cost import CostModel
from slimpack.cost.flops import layer_backward_flops, layer_forward_flops
from slimpack.units import GIB, MIB

HELP = "cost of a slice (tokens after a prefix of its sample): FLOPs, time, activation memory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=positive_int, required=True, metavar="C", help="tokens in the slice")
    parser.add_argument("--prefix", type=non_negative_int, default=0, metavar="P",
                        help="tokens of the same sample before the slice, e.g. 120K (default 0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_config_arguments(parser, default=PLANNING_CONFIG, training=False)
    parser.add_argument("--recompute", choices=("none", "selective", "full"), help="activation recomputation")


def cost_report(cost: CostModel, tokens: int, prefix: int) -> dict:
    """``per_layer`` and ``model`` (all transformer layers, no embedding or LM head) figures."""
    model = cost.model
    recompute = cost.recompute
    per_layer = {
        "forward_flops": layer_forward_flops(model, tokens, prefix),
        "backward_flops": layer_backward_flops(model, tokens, prefix, recompute=recompute),
        "forward_time_s": cost.layer_time([tokens], [prefix], backward=False),
        "backward_time_s": cost.layer_time([tokens], [prefix], backward=True),
        "activation_bytes": cost.layer_activation_bytes(tokens),
    }
    layers = model.num_layers
    whole = {key: value * layers for key, value in per_layer.items()}
    par = cost.config.parallel
    return {"model_name": model.name, "gpu": cost.config.cluster.name, "tokens": tokens, "prefix": prefix,
            "num_layers": layers, "tp": par.tp, "cp": par.cp, "recompute": recompute, "per_layer": per_layer, "model": whole}


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.recompute:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, recompute=args.recompute))
    report = cost_report(CostModel(config), args.tokens, args.prefix)
    if args.json:
        print_json(report)
        return 0
    table = Table(title=f"{report['model_name']} on {report['gpu']}: slice of {args.tokens} tokens after "
                        f"{args.prefix} (tp={report['tp']}, cp={report['cp']}, recompute={report['recompute']})")
    table.add_column("")
    table.add_column("per layer", justify="right")
    table.add_column(f"model ({report['num_layers']} layers)", justify="right")
    rows = (("forward FLOPs", "forward_flops", "{:.4g}"), ("backward FLOPs", "backward_flops", "{:.4g}"),
            ("forward time", "forward_time_s", "ms"), ("backward time", "backward_time_s", "ms"),
            ("activation memory", "activation_bytes", "GiB"))
    for label, key, fmt in rows:
        a, b = report["per_layer"][key], report["model"][key]
        if fmt == "ms":
            cells = (f"{a * 1e3:.3f} ms", f"{b * 1e3:.2f} ms")
        elif fmt == "GiB":
            cells = (f"{a / MIB:.1f} MiB", f"{b / GIB:.2f} GiB")
        else:
            cells = (fmt.format(a), fmt.format(b))
        table.add_row(label, *cells)
    Console().print(table)
    return 0

