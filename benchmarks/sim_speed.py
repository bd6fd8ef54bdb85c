"""How long the simulator takes on a 256-GPU step, on one CPU core.

The step: Llama 2 7B on pp=8 x dp=32 (tp=1, cp=1) H100s, a global batch of 32 x 64 sequences of
16K tokens packed by the ``fixed`` strategy (Megatron's fixed-length packing), so every pipeline runs
64 groups: 32 pipelines x 8 stages x 128 actions = 32,768 timed actions. Document lengths are drawn
from a log-normal (median ~1.8K tokens, long tail cut at the context) with a fixed seed, so every run
simulates the same plan.

    PYTHONPATH=src python benchmarks/sim_speed.py [--runs 7] [--cpu 0]

Prints the median (and min/max) wall time and the median CPU time of ``check_plan``,
``simulate(check=False)`` and ``simulate`` (which checks first), and the plan's efficiency as a
sanity check. Results: docs/sim-speed.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.plan.check import check_plan
from slimpack.plan.types import Plan, Sample
from slimpack.sim import simulate
from slimpack.strategies import make_planner

CONTEXT = 16 * 1024
PP, DP, GROUPS_PER_PIPELINE = 8, 32, 64


def benchmark_plan(seed: int = 0) -> Plan:
    budget = DP * GROUPS_PER_PIPELINE * CONTEXT
    config = build_config(model="llama2-7b", gpu="h100-sxm", parallel=ParallelConfig(pp=PP, dp=DP),
                          train=TrainConfig(max_context=CONTEXT, global_batch_tokens=budget))
    rng = np.random.default_rng(seed)
    samples, total = [], 0
    while total < budget:
        length = min(CONTEXT, budget - total, max(16, int(rng.lognormal(7.5, 1.2))))
        samples.append(Sample(id=len(samples), length=length))
        total += length
    plan = make_planner("fixed", config).plan(samples, step=0)
    assert all(len(p.forward) == GROUPS_PER_PIPELINE for p in plan.pipelines)
    return plan


def _times(run, runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each run: on a shared machine CPU time shows what the wall time
    would be without neighbours competing for the core."""
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per measurement (default 7)")
    parser.add_argument("--cpu", type=int, default=0, help="the one CPU core to run on (default 0)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    plan = benchmark_plan()
    cost = CostModel(plan.config)
    result = simulate(plan, cost)  # warm-up (imports, caches of the interpreter)
    actions = sum(1 for span in result.spans if span.kind in ("F", "B"))
    print(f"{platform.python_implementation()} {platform.python_version()}, numpy {np.__version__}, "
          f"pinned to CPU {args.cpu}; {len(plan.pipelines)} pipelines x {PP} stages, {actions} actions, "
          f"{len(plan.samples)} samples, efficiency {result.efficiency:.3f}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'measurement':24s} {'wall median':>12s} {'min':>8s} {'max':>8s} {'CPU median':>11s}   ({args.runs} runs)")
    for name, run in (("check_plan", lambda: check_plan(plan)),
                      ("simulate(check=False)", lambda: simulate(plan, cost, check=False)),
                      ("simulate", lambda: simulate(plan, cost))):
        wall, cpu = _times(run, args.runs)
        print(f"{name:24s} {statistics.median(wall):11.3f}s {min(wall):7.3f}s {max(wall):7.3f}s "
              f"{statistics.median(cpu):10.3f}s")


if __name__ == "__main__":
    main()
