"""What each SlimPack idea adds: the default planner against itself with one idea switched off (or,
for the MILP refinement, which is off by default, switched on), on the same batches, written to
docs/ablation.md.

    python benchmarks/ablation.py [--warmup 2 --steps 8]

Variants: slicing, asymmetric backward groups, DP-aware (cost-balanced) phase 1, DP-Merge, the
beyond-the-paper look-ahead, and the MILP refinement. Settings: long-tailed datasets at 128K and
256K context on Llama-2-7B (64 and 256 H100s) and Llama-2-70B.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from slimpack.compare.run import DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS, Window, run_strategy
from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.data import load_dataset

SWITCHES = ("use_slicing", "use_asymmetric", "use_cost_balance", "use_dp_merge", "use_lookahead", "use_milp")
"""Each variant flips one switch from its default."""
MI = 2**20
SETTINGS = (  # dataset, model, context, layout, recompute, global batch tokens
    ("wikipedia", "llama2-7b", 131072, ParallelConfig(tp=8, pp=4, dp=2), "selective", 4 * MI),
    ("wlbllm", "llama2-7b", 131072, ParallelConfig(tp=8, pp=4, dp=2), "selective", 4 * MI),
    ("textbooks", "llama2-7b", 262144, ParallelConfig(tp=8, pp=4, cp=2, dp=4), "selective", 16 * MI),
    ("wikipedia", "llama2-7b", 262144, ParallelConfig(tp=8, pp=4, cp=2, dp=4), "selective", 16 * MI),
    # few tokens per replica next to 256K outliers: where DP-Merge has to act
    ("wikipedia", "llama2-7b", 262144, ParallelConfig(tp=8, pp=4, dp=8), "selective", 4 * MI),
    ("cpython", "llama2-70b", 131072, ParallelConfig(tp=8, pp=8, cp=2, dp=2), "full", 16 * MI),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP_STEPS, help="unmeasured steps first")
    parser.add_argument("--steps", type=int, default=DEFAULT_WINDOW_STEPS, help="measured window")
    parser.add_argument("--out", default="docs/ablation.md")
    args = parser.parse_args()
    lines = ["# SlimPack ablation", "",
             "Simulated tokens/s of the default planner and of the planner with one switch flipped "
             f"(same window of {args.steps} batches after {args.warmup} warm-up steps, default H100 cost model). Cells: tokens/s relative to the default planner "
             "(an idea switched off: below 1.00 = it helps; the MILP switched on: above 1.00 = it helps), with efficiency "
             "in brackets.", "",
             f"Reproduce: `python {' '.join(sys.argv)}`", "",
             "| setting | default | " + " | ".join(variant_label(s) for s in SWITCHES) + " |",
             "|---|---:|" + "---:|" * len(SWITCHES)]
    for dataset, model, context, parallel, recompute, batch in SETTINGS:
        config = build_config(model=model, parallel=parallel,
                              train=TrainConfig(max_context=context, recompute=recompute, global_batch_tokens=batch))
        data, window = load_dataset(dataset), Window(warmup_steps=args.warmup, steps=args.steps)
        began = time.perf_counter()
        cells = []
        reference = None
        for switch in (None, *SWITCHES):
            variant = config if switch is None else dataset_variant(config, switch)
            metrics = run_strategy("slimpack", variant, data, window).metrics()
            if switch is None:
                reference = metrics
                cells.append(f"{metrics.tokens_per_s:,.0f} ({metrics.efficiency:.3f})")
            else:
                oom = " OOM" if metrics.oom_steps else ""
                cells.append(f"{metrics.tokens_per_s / reference.tokens_per_s:.3f} ({metrics.efficiency:.3f}){oom}")
        setting = (f"{dataset}, {model}, {context // 1024}K, {parallel.num_devices} GPUs (cp {parallel.cp}), "
                   f"{batch // MI}M-token batches")
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
        print(lines[-1], f"({time.perf_counter() - began:.0f} s)", flush=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def variant_label(switch: str) -> str:
    return f"{'with' if not getattr(PlannerConfig(), switch) else 'no'} {switch[4:].replace('_', ' ')}"


def dataset_variant(config, switch: str):
    flipped = not getattr(config.planner, switch)
    return dataclasses.replace(config, planner=dataclasses.replace(config.planner, **{switch: flipped}))


if __name__ == "__main__":
    raise SystemExit(main())
