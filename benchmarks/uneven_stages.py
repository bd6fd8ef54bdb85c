"""SlimPack on llama3-8b (128K vocabulary) with the even layer split and with the uneven split that
``balanced_stage_layers`` proposes, on 64 H100s (default: the matrix's layout tp 8 x pp 4 x dp 2 with
selective recomputation), 4M-token batches, simulated. Prints a markdown table, one row per run.

    python benchmarks/uneven_stages.py --datasets wikipedia,wlbllm --contexts 64K,128K --steps 4
    python benchmarks/uneven_stages.py --pp 2 --recompute none --contexts 64K,128K --steps 4
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from slimpack.compare import Window, compare
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost.stages import balanced_stage_layers
from slimpack.data import load_dataset
from slimpack.strategies.stream import stream_batches

CONTEXTS = {"64K": 65536, "128K": 131072, "256K": 262144}


def run_cell(dataset: str, context: int, steps: int, strategy: str, tp: int, pp: int, recompute: str) -> list[str]:
    config = build_config(model="llama3-8b", parallel=ParallelConfig(tp=tp, pp=pp, dp=64 // (tp * pp)),
                          train=TrainConfig(max_context=context, global_batch_tokens=4 * 2**20,
                                            recompute=recompute))
    data = load_dataset(dataset)
    lengths = [s.length for s in stream_batches(data, config, 1)[0]]
    split = balanced_stage_layers(config, lengths)
    uneven = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, stage_layers=split))
    rows = []
    for name, cfg in (("even", config), ("/".join(map(str, split)), uneven)):
        began = time.perf_counter()
        (row,) = compare(cfg, data, [strategy], Window(warmup_steps=0, steps=steps)).table()
        rows.append(f"| {dataset} | {context // 1024}K | {name} | {row.tokens_per_s:,.0f} | "
                    f"{row.efficiency:.3f} | {row.peak_memory_bytes / 2**30:.1f} GiB | "
                    f"{time.perf_counter() - began:.0f} s |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="wikipedia")
    parser.add_argument("--contexts", default="64K,128K")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--strategy", default="slimpack")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--recompute", default="selective")
    args = parser.parse_args()
    print("| dataset | context | layers per stage | tokens/s | efficiency | peak memory | wall |")
    print("|---|---|---|---:|---:|---:|---:|")
    for dataset in args.datasets.split(","):
        for context in args.contexts.split(","):
            run_cell(dataset, CONTEXTS[context], args.steps, args.strategy, args.tp, args.pp, args.recompute)


if __name__ == "__main__":
    main()
