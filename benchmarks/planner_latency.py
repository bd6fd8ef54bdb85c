"""SlimPack planner latency on one core: p50/p99 wall time per step for 32, 128 and 256 GPUs at
128K context (Llama-2-7B, tp 8 x pp 4, 64K tokens per GPU per batch, wikipedia), with and without
the MILP refinement, written to docs/planner-latency.md.

    taskset -c 0 python benchmarks/planner_latency.py [--steps 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
from pathlib import Path

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.sim import simulate
from slimpack.strategies.stream import PlanStream


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="docs/planner-latency.md")
    args = parser.parse_args()
    dataset = load_dataset("wikipedia")
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | head -1"], capture_output=True, text=True)
    lines = ["# SlimPack planner latency", "",
             f"Wall time of `SlimPackPlanner.plan` per step on one core ({cpu.stdout.split(':')[-1].strip()}), "
             f"{args.steps} consecutive wikipedia batches, Llama-2-7B at 128K context, tp 8 x pp 4, 64K tokens per GPU "
             "per batch; step time is the simulated time of the step the plan is for.", "",
             f"Reproduce: `taskset -c 0 python {' '.join(sys.argv)}`", "",
             "| GPUs | samples per batch | MILP | p50 (s) | p99 (s) | simulated step (s) | planning / step |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for dp in (1, 4, 8):
        config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=dp),
                              train=TrainConfig(max_context=131072, global_batch_tokens=65536 * 32 * dp))
        for milp in (True, False):
            variant = dataclasses.replace(config, planner=dataclasses.replace(config.planner, use_milp=milp))
            stream = PlanStream(dataset, variant, "slimpack")
            times, steps, samples = [], [], []
            for _ in range(args.steps):
                planned = next(stream)
                times.append(planned.planner_time_s)
                steps.append(simulate(planned.plan).step_time_s)
                samples.append(len(planned.plan.samples))
            times.sort()
            p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
            lines.append(f"| {32 * dp} | {statistics.mean(samples):,.0f} | {'on' if milp else 'off'} | "
                         f"{statistics.median(times):.2f} | {p99:.2f} | {statistics.mean(steps):.2f} | "
                         f"{statistics.median(times) / statistics.mean(steps):.1%} |")
            print(lines[-1], flush=True)
            Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
