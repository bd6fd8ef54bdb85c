"""SlimPack planner latency on one core: p50/p99 wall time per step at 256 and 2048 GPUs (issue 12's
targets: 1 s and 2 s) at 128K context (Llama-2-7B, tp 8 x pp 4, 64K tokens per GPU per batch,
wikipedia), with and without the MILP refinement, as a table written to ``--out`` (by default
planner-latency.md in the current folder: docs/planner-latency.md is the hand-kept record of every
session's runs, which a run must not overwrite). One planner
plans consecutive steps, as in training: step 0 (and every FULL_SEARCH_EVERY-th) runs the full
candidate search, the others search around the previous step's winner.

    taskset -c 0 python benchmarks/planner_latency.py [--steps 10] [--gpus 256,2048] [--milp on,off]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
    parser.add_argument("--out", default="planner-latency.md",
                        help="table to write (default planner-latency.md; not docs/planner-latency.md, the record)")
    parser.add_argument("--gpus", default="256,2048", help="comma-separated GPU counts (multiples of 32)")
    parser.add_argument("--milp", default="on,off", help="comma-separated: on, off")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    if any(g % 32 for g in gpus) or not set(args.milp.split(",")) <= {"on", "off"}:
        print("planner_latency: --gpus takes multiples of 32, --milp takes on/off", file=sys.stderr)
        return 2
    dataset = load_dataset("wikipedia")
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | head -1"], capture_output=True, text=True)
    lines = ["# SlimPack planner latency", "",
             f"Wall time of `SlimPackPlanner.plan` per step on one core ({cpu.stdout.split(':')[-1].strip()}), "
             f"{args.steps} consecutive wikipedia batches, Llama-2-7B at 128K context, tp 8 x pp 4, 64K tokens per GPU "
             "per batch; step time is the simulated time of the step the plan is for.", "",
             f"Reproduce: `taskset -c 0 python {' '.join(sys.argv)}`", "",
             f"Load average when the run started: {os.getloadavg()[0]:.1f} (on a machine of {os.cpu_count()} cores).", "",
             "p50/p99: wall time of the planner call; CPU: the process's CPU time over the same steps (on a "
             "shared machine the wall time also counts the time other processes held the core).", "",
             "p50/p99 are over every step (p99: the nearest rank, so over 100 steps the second slowest); "
             "step 0, which has no previous step to seed its search, runs the full search: its CPU time is "
             "also shown on its own.", "",
             "| GPUs | samples per batch | MILP | p50 (s) | p99 (s) | CPU p50 (s) | CPU p99 (s) | step 0 CPU (s) "
             "| simulated step (s) | planning / step |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for dp in (g // 32 for g in gpus):
        config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=dp),
                              train=TrainConfig(max_context=131072, global_batch_tokens=65536 * 32 * dp))
        for milp in (m == "on" for m in args.milp.split(",")):
            variant = dataclasses.replace(config, planner=dataclasses.replace(config.planner, use_milp=milp))
            stream = PlanStream(dataset, variant, "slimpack")
            times, cpu, steps, samples = [], [], [], []
            for step in range(args.steps):
                planned = next(stream)
                plan = planned.plan
                times.append(planned.planner_time_s)
                cpu.append(planned.planner_cpu_s)
                print(f"  {32 * dp} GPUs, MILP {'on' if milp else 'off'}, step {step}: {times[-1]:.2f} s, "
                      f"CPU {cpu[-1]:.2f} s ({plan.info.get('search', plan.info.get('slimpack', {}).get('search'))} "
                      "search)", flush=True)
                steps.append(simulate(plan).step_time_s)
                samples.append(len(plan.samples))
            lines.append(f"| {32 * dp} | {statistics.mean(samples):,.0f} | {'on' if milp else 'off'} | "
                         f"{statistics.median(times):.2f} | {_p99(times):.2f} | {statistics.median(cpu):.2f} | "
                         f"{_p99(cpu):.2f} | {cpu[0]:.2f} | {statistics.mean(steps):.2f} | "
                         f"{statistics.median(times) / statistics.mean(steps):.1%} |")
            print(lines[-1], flush=True)
            Path(args.out).write_text("\n".join(lines) + "\n")
    lines.append(f"\nLoad average when the run ended: {os.getloadavg()[0]:.1f}.")
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


if __name__ == "__main__":
    raise SystemExit(main())
