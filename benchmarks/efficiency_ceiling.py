"""How high any plan's efficiency can go on each layout, under the cost model (issue 14).

For a model, dataset, context, global batch and GPU budget, every layout ``slimpack tune`` would
search (``tune.search.candidate_layouts``) whose memory floor fits gets its **ceiling**: the ideal
step (whole-document work over the GPUs, DESIGN.md §3) over the tune's time floor for SlimPack
(``tune.bounds.time_floor_s``: the batch's work per stage as one group at the layout's cp, over the
replicas, plus the gradient sync and optimizer; no bubble, no memory limit). No plan of that
layout reaches a higher efficiency. The best ``--top`` layouts are then planned and simulated
(SlimPack, step 0) to show what a plan reaches. Simulated with the default H100 cost model.

    python benchmarks/efficiency_ceiling.py --model llama3-8b --max-context 64K --global-batch-tokens 4M
"""

from __future__ import annotations

import argparse

from slimpack import api
from slimpack.cli.common import positive_int
from slimpack.config import TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.sim import simulate
from slimpack.strategies.stream import stream_batches
from slimpack.tune.bounds import memory_floor_bytes, time_floor_s
from slimpack.tune.search import candidate_layouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--dataset", default="wikipedia")
    parser.add_argument("--max-context", type=positive_int, default=65536)
    parser.add_argument("--global-batch-tokens", type=positive_int, default=4 * 2**20)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--top", type=int, default=6, help="layouts planned and simulated (highest ceilings)")
    args = parser.parse_args()
    base = build_config(model=args.model, train=TrainConfig(max_context=args.max_context,
                                                            global_batch_tokens=args.global_batch_tokens))
    data = api.dataset(args.dataset)
    batch = stream_batches(data, base, 1)[0]
    lengths = [s.length for s in batch]
    rows = []
    for layout, config in candidate_layouts(base, args.gpus, [batch])[0]:
        cost = CostModel(config)
        if memory_floor_bytes(cost, max(lengths), "slimpack") > config.cluster.usable_memory_bytes:
            continue
        ideal = cost.whole_document_seconds(lengths) / config.parallel.num_devices
        rows.append((ideal / time_floor_s(cost, [lengths], "slimpack"), layout, config))
    rows.sort(key=lambda row: -row[0])
    print(f"{args.model}, {args.dataset}, {args.max_context // 1024}K context, {args.global_batch_tokens:,}-token "
          f"batch, {args.gpus} GPUs: {len(rows)} layouts fit their memory floor")
    print("| layout | ceiling (ideal / time floor) | SlimPack step 0 efficiency | of the ceiling |")
    print("|---|---:|---:|---:|")
    for ceiling, layout, config in rows[:args.top]:
        result = simulate(api.plan_batch(lengths, config))
        flag = " (OOM)" if result.oom else ""
        print(f"| {layout.label()} | {ceiling:.3f} | {result.efficiency:.3f}{flag} | {result.efficiency / ceiling:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
