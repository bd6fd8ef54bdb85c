"""The paper-style benchmark matrix: datasets x models x max context x cluster size, every strategy
side by side in one run per cell (same batches), written to docs/RESULTS.md.

    python benchmarks/matrix.py                      # the full matrix (tens of minutes on one core)
    python benchmarks/matrix.py --datasets wikipedia --models llama2-7b --contexts 128K --sizes small

Layouts are the ones long-context users run (and that fit an H100's memory for the fixed-length
baseline): Llama 7B/8B with tp 8 x pp 4 (cp 2 at 256K), Llama 70B with tp 8 x pp 8 and full
recomputation (cp 2 at 128K, cp 4 at 256K); "small" is one or two pipelines, "large" is 256 GPUs.
The global batch is 64K tokens per GPU (4M tokens on 64 GPUs). Shorter contexts (32K) use tp 4.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from slimpack.compare import Window, compare
from slimpack.compare.run import DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import bundled_datasets, load_dataset
from slimpack.strategies import STRATEGIES

MODELS = ("llama2-7b", "llama3-8b", "llama2-70b")
CONTEXTS = {"32K": 32768, "64K": 65536, "128K": 131072, "256K": 262144}
SIZES = ("small", "large")
TOKENS_PER_GPU = 65536


def layout(model: str, context: int, size: str) -> tuple[ParallelConfig, str]:
    big = model.endswith("70b")
    tp = 8 if (big or context > 32768) else 4
    pp = 8 if big else 4
    cp = {262144: 4 if big else 2, 131072: 2 if big else 1}.get(context, 1)
    per_pipeline = tp * pp * cp
    gpus = 256 if size == "large" else max(64, per_pipeline)
    dp = max(1, gpus // per_pipeline)
    return ParallelConfig(tp=tp, pp=pp, cp=cp, dp=dp), "full" if big else "selective"


def run_cell(dataset: str, model: str, context: int, size: str, window: Window) -> dict:
    parallel, recompute = layout(model, context, size)
    batch = TOKENS_PER_GPU * parallel.num_devices
    config = build_config(model=model, gpu="h100-sxm", parallel=parallel,
                          train=TrainConfig(max_context=context, global_batch_tokens=max(batch, context),
                                            recompute=recompute))
    began = time.perf_counter()
    rows = [row.to_dict() for row in compare(config, load_dataset(dataset), list(STRATEGIES), window).table()]
    return {"dataset": dataset, "model": model, "context": context, "size": size,
            "layout": f"tp{parallel.tp} pp{parallel.pp} cp{parallel.cp} dp{parallel.dp} = {parallel.num_devices} GPUs",
            "batch_tokens": config.train.global_batch_tokens, "recompute": recompute, "window": window.to_dict(),
            "seconds": time.perf_counter() - began, "rows": rows}


def cell_markdown(cell: dict) -> str:
    head = (f"#### {cell['dataset']} / {cell['model']} / {cell['context'] // 1024}K / {cell['layout']}\n\n"
            "| strategy | tokens/s | vs fixed | efficiency | bubble | peak mem (GiB) | OOM steps | planner p50 (s) | delay |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in cell["rows"]:
        if r["efficiency"] is None:
            lines.append(f"| {r['strategy']} | failed: {'; '.join(r['errors'])[:80]} | | | | | | | |")
            continue
        lines.append(f"| {r['strategy']} | {r['tokens_per_s']:,.0f} | {r['speedup_vs_fixed']:.2f}x | "
                     f"{r['efficiency']:.3f} | {100 * r['bubble_fraction']:.1f}% | {r['peak_memory_bytes'] / 2**30:.1f} | "
                     f"{len(r['oom_steps'])} | {r['planner_time_p50_s']:.2f} | {r['mean_delay_steps_per_token']:.2f} |")
    return "\n".join(lines)


def work_per_token(row: dict) -> float:
    """Ideal (compute) seconds per trained token: mean ideal step / (tokens/s x mean step time)."""
    return row["ideal_time_mean_s"] / (row["tokens_per_s"] * row["step_time_mean_s"])


def summary_row(cell: dict) -> str:
    rows = {r["strategy"]: r for r in cell["rows"]}
    ours = rows["slimpack"]
    fits = [r for name, r in rows.items() if name != "slimpack" and r["efficiency"] is not None and not r["oom_steps"]]
    best = max(fits, key=lambda r: r["tokens_per_s"], default=None)
    lead = ours["tokens_per_s"] / best["tokens_per_s"] if best else float("nan")
    work = work_per_token(best) / work_per_token(ours) if best else float("nan")
    verdict = "yes" if (best is None or ours["tokens_per_s"] >= best["tokens_per_s"]) and not ours["oom_steps"] else "NO"
    return (f"| {cell['dataset']} | {cell['model']} | {cell['context'] // 1024}K | {cell['layout']} | "
            f"{ours['efficiency']:.3f} | {ours['speedup_vs_fixed']:.2f}x | {best['strategy'] if best else '—'} "
            f"({best['efficiency']:.3f}) | {work:.3f} | {lead:.2f}x | {len(ours['oom_steps'])} | {verdict} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default=",".join(bundled_datasets()))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--contexts", default=",".join(CONTEXTS))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP_STEPS, help="unmeasured steps first")
    parser.add_argument("--steps", type=int, default=DEFAULT_WINDOW_STEPS, help="measured window")
    parser.add_argument("--out", default="docs/RESULTS.md")
    parser.add_argument("--json", default="docs/results.json")
    parser.add_argument("--from-json", action="store_true",
                        help="rewrite --out from the cells already in --json (no planning)")
    args = parser.parse_args()
    if args.from_json:
        cells = json.loads(Path(args.json).read_text())
        write(cells, args, f"benchmarks/matrix.py --warmup {args.warmup} --steps {args.steps}")
        return 0
    cells = []
    grid = [(d, m, c, s) for d in args.datasets.split(",") for m in args.models.split(",")
            for c in args.contexts.split(",") for s in args.sizes.split(",")]
    for k, (dataset, model, context, size) in enumerate(grid, 1):
        cell = run_cell(dataset, model, CONTEXTS[context], size,
                        Window(warmup_steps=args.warmup, steps=args.steps))
        cells.append(cell)
        print(f"[{k}/{len(grid)}] {summary_row(cell)} ({cell['seconds']:.0f} s)", flush=True)
        write(cells, args, " ".join(sys.argv))
    return 0


def overview(cells: list[dict]) -> str:
    """Per context: SlimPack's efficiency, its speed-up over fixed, over WLB-LLM and over the best
    baseline that fits in memory (min / median / max over the cells)."""
    lines = ["| context | cells | SlimPack efficiency | vs fixed | vs wlb | vs best baseline | cells where SlimPack >= all |",
             "|---|---:|---|---|---|---|---:|"]

    def spread(values: list[float], spec: str) -> str:
        ordered = sorted(values)
        return f"{format(ordered[0], spec)} / {format(ordered[len(ordered) // 2], spec)} / {format(ordered[-1], spec)}"

    for context in sorted({c["context"] for c in cells}):
        group = [c for c in cells if c["context"] == context]
        eff, fixed, wlb, best, wins = [], [], [], [], 0
        for c in group:
            rows = {r["strategy"]: r for r in c["rows"]}
            ours = rows["slimpack"]
            fits = [r for n, r in rows.items() if n != "slimpack" and r["efficiency"] is not None and not r["oom_steps"]]
            top = max(r["tokens_per_s"] for r in fits)
            eff.append(ours["efficiency"])
            fixed.append(ours["speedup_vs_fixed"])
            wlb.append(ours["tokens_per_s"] / rows["wlb"]["tokens_per_s"])
            best.append(ours["tokens_per_s"] / top)
            wins += ours["tokens_per_s"] >= top and not ours["oom_steps"]
        lines.append(f"| {context // 1024}K | {len(group)} | {spread(eff, '.3f')} | {spread(fixed, '.2f')} | "
                     f"{spread(wlb, '.2f')} | {spread(best, '.3f')} | {wins} |")
    return "Min / median / max over the cells of each context length:\n\n" + "\n".join(lines)


def write(cells: list[dict], args: argparse.Namespace, command: str) -> None:
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | head -1"], capture_output=True, text=True).stdout
    header = (
        "# Benchmark matrix: every strategy side by side\n\n"
        "Simulated with slimpack's DAG simulator and its default (uncalibrated) H100 cost model: the numbers "
        "compare plans, they are not measurements of a real cluster. Each cell plans and simulates the same "
        f"consecutive global batches with every strategy in one run: {args.warmup} warm-up steps, then a "
        f"measured window of {args.steps} steps; work a strategy defers is carried across the window, and its "
        "drain after the window is not in the figures. `vs fixed` = tokens/s over Megatron-style fixed-length packing; "
        "efficiency = the plan's compute spread evenly over all GPUs / simulated step time. Note that "
        "`fixed` and `slimpipe` (which packs like `fixed`) cut documents at sequence boundaries, so the "
        "pieces do not attend to each other: they compute less attention than the other strategies for "
        "the same tokens (and train a different objective); the others keep every document whole or, "
        "like SlimPack, slice it without losing attention.\n\n"
        f"Reproduce: `python {command}` (planning ran on one core of: {cpu.split(':')[-1].strip() or platform.processor()}).\n\n"
        "## Overview\n\n" + overview(cells) + "\n\n"
        "## Summary: SlimPack against the best baseline that fits in memory\n\n"
        "`its work` = the best baseline's compute per trained token relative to SlimPack's (below 1: it "
        "computes less, by cutting documents).\n\n"
        "| dataset | model | context | layout | SlimPack efficiency | SlimPack vs fixed | best baseline (efficiency) | "
        "its work | SlimPack / best | SlimPack OOM steps | SlimPack >= all |\n|---|---|---|---|---:|---:|---|---:|---:|---:|---|")
    body = [header, *(summary_row(c) for c in cells), "\n## Every cell\n", *(cell_markdown(c) for c in cells)]
    Path(args.out).write_text("\n".join(body) + "\n")
    Path(args.json).write_text(json.dumps(cells, indent=1, default=str) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
