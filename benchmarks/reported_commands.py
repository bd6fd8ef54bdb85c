"""The `slimpack compare` commands that broke SlimPack's planner outside the matrix's band (issue 12's
table: 4x the matrix's tokens per GPU, cp 2 at 256K, DP-Merge at dp 8, interleaving on 70B, short
contexts), re-run as a user would type them, each as one `compare` run of every strategy over the
comparison protocol's window (2 warm-up steps, 8 measured; the issue's runs were 2 steps, a horizon
that flatters the deferring WLB-LLM on tokens/s).

    python benchmarks/reported_commands.py [--only 1,3] [--warmup 2] [--steps 8] [--extra="--cut-documents"]
    python benchmarks/reported_commands.py --set tied   # the small presets whose LM head is their embedding

``--set tied`` runs the same way over the Llama 3.2 and Qwen2.5 1.5-3B presets, which tie their head to
their embedding (over a pipeline the last stage holds a copy of it), at 16-32 GPUs.

Prints one markdown row per command: SlimPack's tokens/s and efficiency, its out-of-memory steps,
the best baseline by tokens/s and by efficiency (fitting in memory), and the ratios. Simulated with
the default H100 cost model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (
    "--model llama2-7b --tp 8 --pp 4 --dp 2 --max-context 128K --global-batch-tokens 16M",
    "--model llama2-7b --tp 8 --pp 4 --dp 2 --max-context 64K --global-batch-tokens 16M --dataset wlbllm",
    "--model llama2-7b --tp 8 --pp 4 --cp 2 --dp 1 --max-context 256K --global-batch-tokens 16M",
    "--model llama2-7b --tp 2 --pp 2 --cp 2 --dp 8 --max-context 256K --global-batch-tokens 16M --recompute none",
    "--model llama2-70b --tp 8 --pp 8 --vpp 2 --dp 1 --max-context 64K --global-batch-tokens 4M --recompute full",
    "--model llama3-8b --tp 4 --pp 4 --dp 4 --max-context 32K --global-batch-tokens 4M --dataset pydocs",
)
TIED_COMMANDS = (
    "--model llama3.2-1b --tp 1 --pp 2 --dp 8 --max-context 64K --global-batch-tokens 2M",
    "--model llama3.2-1b --tp 1 --pp 2 --cp 2 --dp 4 --max-context 64K --global-batch-tokens 2M",
    "--model llama3.2-1b --tp 2 --pp 1 --dp 8 --max-context 32K --global-batch-tokens 2M --dataset cpython",
    "--model llama3.2-3b --tp 4 --pp 2 --dp 2 --max-context 64K --global-batch-tokens 2M --dataset textbooks",
    "--model qwen2.5-1.5b --tp 1 --pp 4 --dp 4 --max-context 32K --global-batch-tokens 1M --dataset pydocs",
    "--model qwen2.5-3b --tp 2 --pp 4 --vpp 2 --dp 2 --max-context 64K --global-batch-tokens 2M --stage-layers balanced",
    "--model qwen2.5-3b --tp 2 --pp 2 --cp 2 --dp 2 --max-context 256K --global-batch-tokens 4M --dataset wlbllm",
)
SETS = {"issue12": COMMANDS, "tied": TIED_COMMANDS}


def run(command: str, warmup: int, steps: int) -> dict:
    """One `slimpack compare` run of ``command``: its JSON rows by strategy, and its wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "slimpack", "compare", *command.split(), "--warmup", str(warmup),
                        "--steps", str(steps), "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
        rows = json.loads(out.read_text())["strategies"]
    return {"rows": {r["strategy"]: r for r in rows}, "seconds": time.perf_counter() - began}


def row(index: int, command: str, result: dict) -> str:
    rows = result["rows"]
    ours = rows["slimpack"]
    fitting = {name: r for name, r in rows.items()
               if name != "slimpack" and not r["oom_steps"] and not r["failed_steps"]}
    if fitting:
        by_speed = max(fitting, key=lambda n: fitting[n]["tokens_per_s"])
        by_work = max(fitting, key=lambda n: fitting[n]["efficiency"])
        speed = f"{by_speed} {fitting[by_speed]['tokens_per_s']:,.0f} | {ours['tokens_per_s'] / fitting[by_speed]['tokens_per_s']:.3f}"
        work = f"{by_work} {fitting[by_work]['efficiency']:.3f} | {ours['efficiency'] / fitting[by_work]['efficiency']:.3f}"
    else:
        speed = work = "none fits | -"
    oom = f"{len(ours['oom_steps'])} OOM, {len(ours['failed_steps'])} failed"
    return (f"| {index} | `{command}` | {ours['tokens_per_s']:,.0f} | {ours['efficiency']:.3f} | {oom} | "
            f"{speed} | {work} | {result['seconds']:.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma list of command numbers (1-based)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--extra", default="", help="flags added to every command, e.g. --extra=--cut-documents")
    parser.add_argument("--set", choices=list(SETS), default="issue12", help="which commands (default: issue 12's)")
    args = parser.parse_args()
    commands = SETS[args.set]
    chosen = [int(i) for i in args.only.split(",")] if args.only else range(1, len(commands) + 1)
    print("| # | `slimpack compare` ... | SlimPack tokens/s | efficiency | SlimPack steps out of memory | "
          "best baseline by tokens/s | SlimPack / it | best baseline by efficiency | SlimPack / it | wall s |")
    print("|---:|---|---:|---:|---|---|---:|---|---:|---:|")
    for index in chosen:
        command = f"{commands[index - 1]} {args.extra}".strip()
        print(row(index, command, run(command, args.warmup, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
