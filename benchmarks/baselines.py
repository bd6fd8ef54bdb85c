"""Simulated throughput of the baselines (and SlimPack) over consecutive steps of a bundled dataset.

Every strategy plans the same batches (``compare.step_batches``); after the last batch, strategies
that hold samples back (WLB-LLM) get empty batches until they have trained everything, and those
drain steps count, so every strategy is charged for the same tokens.

    PYTHONPATH=src python benchmarks/baselines.py --dataset wlbllm --context 131072 --steps 20
"""

from __future__ import annotations

import argparse
import time

from slimpack.compare.run import step_batches
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.sim import simulate
from slimpack.strategies import STRATEGIES, make_planner

MAX_DRAIN_STEPS = 100


def run(name: str, config, batches) -> dict:
    planner = make_planner(name, config)
    tokens = busy = ideal = planning = 0.0
    effs, steps, step = [], 0, 0
    while True:
        batch = batches[step] if step < len(batches) else []
        began = time.perf_counter()
        plan = planner.plan(batch, step=step)
        planning += time.perf_counter() - began
        result = simulate(plan)
        if result.num_tokens:
            tokens += result.num_tokens
            busy += result.step_time_s
            ideal += result.ideal_time_s
            effs.append(result.efficiency)
            steps += 1
        step += 1
        if step >= len(batches) and (not plan.deferred or step >= len(batches) + MAX_DRAIN_STEPS):
            break
    return {"strategy": name, "steps": steps, "tokens": int(tokens), "tokens_per_s": tokens / busy,
            "efficiency": ideal / busy, "mean_step_efficiency": sum(effs) / len(effs),
            "planner_s_per_step": planning / step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="wlbllm")
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-tokens", type=int, default=4 * 2**20)
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--layout", default="8,4,2", help="tp,pp,dp")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    args = parser.parse_args()
    tp, pp, dp = (int(x) for x in args.layout.split(","))
    config = build_config(model=args.model, gpu=args.gpu, parallel=ParallelConfig(tp=tp, pp=pp, dp=dp),
                          train=TrainConfig(max_context=args.context, global_batch_tokens=args.batch_tokens))
    batches = step_batches(load_dataset(args.dataset), config, args.steps, shuffle=True)
    rows = [run(name, config, batches) for name in args.strategies.split(",")]
    base = next((r["tokens_per_s"] for r in rows if r["strategy"] == "fixed"), None)
    print(f"{args.model} {args.gpu} tp{tp} pp{pp} dp{dp}, context {args.context}, "
          f"{args.batch_tokens} tokens/batch, {args.dataset}, {args.steps} steps (shuffled)")
    print("| strategy | efficiency | tokens/s | vs fixed | steps | planner s/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        print(f"| {r['strategy']} | {r['efficiency']:.3f} | {r['tokens_per_s']:,.0f} | {ratio} | "
              f"{r['steps']} | {r['planner_s_per_step']:.2f} |")


if __name__ == "__main__":
    main()
