"""A DP-Merge plan run for real: the outlier sharded over the merged replicas, memory per rank
against the simulator's. The figures in docs/runtime.md ("DP-Merge, measured").

    PYTHONPATH=src python benchmarks/dp_merge_memory.py [--outlier 4096] [--repeats 1]

dp = 3, pp = 1, tiny model in float32: replicas 0 and 1 merged into one cp-2 pipeline for an
outlier document cut into two slices (forward and backward grouped asymmetrically), replica 2 an
ordinary pipeline of short documents. Each rank runs the plan with the ``ActivationTracker`` on
(``runtime.fidelity.measure_rank``) and reports the rows it ran forward and its peak of bytes kept
for backward; the simulator's per-rank peak comes from ``predicted_activation_peaks`` with each
pipeline's cp (and, for contrast, as if the merged pipeline ran unsharded on one rank, which is what
the runtime did before context parallelism).
"""

from __future__ import annotations

import argparse
import dataclasses

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.runtime.fidelity import measure_rank, predicted_activation_peaks
from slimpack.runtime.launch import spawn
from slimpack.sim import simulate
from slimpack.sim.result import SimResult


def merged_plan(outlier: int) -> Plan:
    config = build_config(model="tiny", parallel=ParallelConfig(dp=3, pp=1),
                          train=TrainConfig(max_context=outlier, global_batch_tokens=outlier + 2048,
                                            recompute="none"))
    cut = outlier * 5 // 8
    s = [Slice(0, 0, cut), Slice(0, cut, outlier), Slice(1, 0, 300)]
    merged = PipelinePlan(replicas=(0, 1), cp=2, forward=((s[0],), (s[1], s[2])), backward=((s[1],), (s[2], s[0])))
    short = [Slice(2, 0, 700), Slice(3, 0, 500), Slice(4, 0, 548)]
    ordinary = PipelinePlan(replicas=(2,), cp=1, forward=((short[0],), (short[1], short[2])),
                            backward=((short[0],), (short[1], short[2])))
    samples = tuple(Sample(id=i, length=n) for i, n in enumerate((outlier, 300, 700, 500, 548)))
    return Plan(config=config, strategy="hand", samples=samples, pipelines=(merged, ordinary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outlier", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    plan = merged_plan(args.outlier)
    cost = CostModel(plan.config)
    sim = simulate(plan, cost)
    per_rank = spawn(measure_rank, 3, (plan, args.repeats, 1), timeout_s=1800)
    print(f"outlier {args.outlier} tokens in slices {[(s.start, s.end) for g in plan.pipelines[0].forward for s in g]}")
    print("| rank | replica | pipeline | rows run forward | measured peak kept (MiB) | simulator (MiB) | ratio |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for r in per_rank:
        index = next(i for i, p in enumerate(plan.pipelines) if r["replica"] in p.replicas)
        pipe = plan.pipelines[index]
        predicted = _pipeline_peak(sim, cost, index, pipe.cp)
        print(f"| {r['rank']} | {r['replica']} | {index} (cp {pipe.cp}) | {r['forward_rows']} | "
              f"{r['peak_activation_bytes'] / 2**20:.3f} | {predicted / 2**20:.3f} | "
              f"{r['peak_activation_bytes'] / predicted:.4f} |")
    print(f"merged pipeline unsharded (one rank, cp 1), simulator: {_pipeline_peak(sim, cost, 0, 1) / 2**20:.3f} MiB")


def _pipeline_peak(sim: SimResult, cost: CostModel, index: int, cp: int) -> float:
    """The simulator's peak kept bytes of pipeline ``index`` on one of its ranks at ``cp``."""
    only = dataclasses.replace(sim, spans=tuple(s for s in sim.spans if s.pipeline == index))
    return predicted_activation_peaks(only, cost, 1, {index: cp})[0]


if __name__ == "__main__":
    main()
