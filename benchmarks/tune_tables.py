"""Best-vs-best tables for docs/tune.md: ``slimpack tune`` on bundled datasets, contexts and GPU
counts (all strategies, llama2-7b on H100s, 64K tokens per GPU per batch; layouts screened on one
step, each strategy's front runners confirmed over the comparison window), simulated with the
default cost model. Writes one JSON and one markdown block per cell into OUT.

    python benchmarks/tune_tables.py --datasets wikipedia --contexts 64K,128K,256K --gpus 64,256 --out docs/tune
    python benchmarks/tune_tables.py --summary docs/tune --gpus 256    # the best-vs-best summary of the cells run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

from slimpack.config import TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.strategies import STRATEGIES
from slimpack.tune import tune
from slimpack.tune.report import markdown_table, search_summary, to_json

CONTEXTS = {"64K": 65536, "128K": 131072, "256K": 262144}
TOKENS_PER_GPU = 65536


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished workers (the machine is shared: wall time
    depends on the other jobs, CPU time much less)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_cell(model: str, dataset: str, context: int, gpus: int, workers: int, out: Path) -> None:
    base = build_config(model=model, train=TrainConfig(max_context=context,
                                                       global_batch_tokens=TOKENS_PER_GPU * gpus))
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = tune(base, load_dataset(dataset), gpus, list(STRATEGIES), workers=workers)
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    name = f"{dataset}-{model}-{context // 1024}K-{gpus}"
    data = to_json(result) | {"cpu_s": cpu, "wall_s": wall, "workers": workers, "load_avg": os.getloadavg()}
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    text = (f"#### {dataset}, {model}, {context // 1024}K context, {gpus} GPUs "
            f"({base.train.global_batch_tokens // 2**20}M-token batches)\n\n{markdown_table(result)}\n\n"
            f"Search: {wall:.0f} s wall, {cpu:.0f} CPU-s, {workers} worker(s), load average "
            f"{os.getloadavg()[0]:.1f} on 2 cores.\n\n```\n" + "\n".join(search_summary(result)) + "\n```\n")
    (out / f"{name}.md").write_text(text)
    print(text, flush=True)


def summary(out: Path, gpus: int) -> str:
    """One row per cell of ``gpus`` GPUs in ``out``: SlimPack's best against fixed's best and the
    best baseline's best, on tokens/s and on efficiency (the same whole-document work basis)."""
    rows = ["| dataset | context | SlimPack's best layout | efficiency | tokens/s over fixed's best "
            "| over the best baseline's best, tokens/s | efficiency over the best baseline's best efficiency "
            "| search wall / CPU s (workers) |",
            "|---|---|---|---:|---:|---:|---:|---:|"]
    for path in sorted(out.glob(f"*-{gpus}.json"), key=lambda p: (json.loads(p.read_text())["max_context"], p.name)):
        cell = json.loads(path.read_text())
        best = {s["strategy"]: s for s in cell["strategies"] if s["tokens_per_s"]}
        ours = best.get("slimpack")
        others = [s for name, s in best.items() if name != "slimpack"]
        if ours is None or not others:
            rows.append(f"| {cell['dataset']} | {cell['max_context'] // 1024}K | no plan | | | | | |")
            continue
        fastest = max(others, key=lambda s: s["tokens_per_s"])
        leanest = max(others, key=lambda s: s["efficiency"])
        fixed = best.get("fixed")
        over_fixed = f"{ours['tokens_per_s'] / fixed['tokens_per_s']:.2f}x" if fixed else "-"
        rows.append(f"| {cell['dataset']} | {cell['max_context'] // 1024}K | {ours['layout']} | "
                    f"{ours['efficiency']:.3f} | {over_fixed} | "
                    f"{ours['tokens_per_s'] / fastest['tokens_per_s']:.2f}x ({fastest['strategy']}) | "
                    f"{ours['efficiency'] / leanest['efficiency']:.2f}x ({leanest['strategy']}) | "
                    f"{cell['wall_s']:.0f} / {cell['cpu_s']:.0f} ({cell['workers']}) |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--datasets", default="wikipedia")
    parser.add_argument("--contexts", default="64K,128K,256K")
    parser.add_argument("--gpus", default="64,256")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="docs/tune")
    parser.add_argument("--summary", metavar="DIR", help="print the summary table of the cells in DIR and stop")
    args = parser.parse_args()
    if args.summary:
        for gpus in map(int, args.gpus.split(",")):
            print(summary(Path(args.summary), gpus))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for gpus in map(int, args.gpus.split(",")):
        for dataset in args.datasets.split(","):
            for context in args.contexts.split(","):
                run_cell(args.model, dataset, CONTEXTS[context], gpus, args.workers, out)


if __name__ == "__main__":
    main()
