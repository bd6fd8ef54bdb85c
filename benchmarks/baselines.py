"""Simulated throughput of the baselines (and SlimPack) over a measured window of a bundled dataset's
shuffled stream, under the comparison protocol (``slimpack.compare``): warm-up steps, then the window;
work a strategy defers past the window is drained and reported apart.

    PYTHONPATH=src python benchmarks/baselines.py --dataset wlbllm --context 131072 --steps 20
"""

from __future__ import annotations

import argparse

from slimpack.compare import Window, compare
from slimpack.compare.run import DEFAULT_WARMUP_STEPS
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.strategies import STRATEGIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="wlbllm")
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP_STEPS)
    parser.add_argument("--steps", type=int, default=20, help="measured window")
    parser.add_argument("--batch-tokens", type=int, default=4 * 2**20)
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--layout", default="8,4,2", help="tp,pp,dp")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    args = parser.parse_args()
    tp, pp, dp = (int(x) for x in args.layout.split(","))
    config = build_config(model=args.model, gpu=args.gpu, parallel=ParallelConfig(tp=tp, pp=pp, dp=dp),
                          train=TrainConfig(max_context=args.context, global_batch_tokens=args.batch_tokens))
    window = Window(warmup_steps=args.warmup, steps=args.steps)
    rows = compare(config, load_dataset(args.dataset), args.strategies.split(","), window, shuffle=True).table()
    print(f"{args.model} {args.gpu} tp{tp} pp{pp} dp{dp}, context {args.context}, "
          f"{args.batch_tokens} tokens/batch, {args.dataset} (shuffled), {window.describe()}")
    print("| strategy | efficiency | tokens/s | vs fixed | planner p50 (s) | held after window |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if not r.ran:
            print(f"| {r.strategy} | failed: {'; '.join(r.errors)[:80]} | | | | |")
            continue
        ratio = f"{r.speedup_vs_fixed:.2f}x" if r.speedup_vs_fixed else "-"
        print(f"| {r.strategy} | {r.efficiency:.3f} | {r.tokens_per_s:,.0f} | {ratio} | "
              f"{r.planner_time_p50_s:.2f} | {r.held_after_window_tokens:,} |")


if __name__ == "__main__":
    main()
