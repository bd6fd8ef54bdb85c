"""What a framework that packs whole samples gets from slimpack, against the full plan that needs
slimpack's runtime: simulated tokens/s over the comparison window, relative to ``kk`` (balanced
whole-sample packing, verl's Karmarkar-Karp), written to stdout as a Markdown table.

    python benchmarks/integrations_gain.py [--warmup 2 --steps 8]

Rows, all on the same batches (Llama-2-7B, 128 H100s as tp 8 x pp 4 x dp 4, 128K context, 4M-token
batches; wikipedia and wlbllm):
- ``fixed``, ``kk``: whole-sample baselines;
- whole-sample SlimPack: planned with ``whole_sample_config`` (no slices, backward groups = forward
  groups, no DP-Merge): what HF/TRL, Megatron-Core, DeepSpeed or torchtitan can run;
- the same two with every replica at the same number of micro-batches (``equal_count_form``, what
  ``rank_micro_batches`` and the HF adapter hand out: frameworks run a fixed number of micro-batches,
  gradient-accumulation steps, per step on every rank; the one-token padding micro-batches that fill
  a short replica's count are not simulated);
- full plan lowered: SlimPack's full plans of the same steps lowered with ``whole_sample_form``;
- full SlimPack: slices, asymmetric backward groups, DP-Merge (slimpack's runtime).
"""

from __future__ import annotations

import argparse
import sys
import time

from slimpack import api
from slimpack.compare.run import DEFAULT_WARMUP_STEPS, DEFAULT_WINDOW_STEPS
from slimpack.errors import UserError
from slimpack.integrations.wholesample import (
    equal_count_form,
    whole_sample_config,
    whole_sample_form,
)

DATASETS = ("wikipedia", "wlbllm")


def transformed_tokens_per_s(run, transform) -> float | str:
    """Tokens/s of the window's plans of ``run`` after ``transform``, or why they cannot run (steps
    the transform refuses or that run out of memory)."""
    tokens = seconds = 0.0
    failed = []
    window = [(record, plan) for record, plan in zip(run.steps, run.plans, strict=True)
              if record.phase == "window" and plan is not None]
    for record, plan in window:
        try:
            result = api.simulate(transform(plan))
        except UserError:
            failed.append(record.step)
            continue
        if result.oom:
            failed.append(record.step)
        tokens += record.scheduled_tokens
        seconds += result.step_time_s
    return f"OOM/refused on {len(failed)} of {len(window)} steps" if failed else tokens / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP_STEPS, help="unmeasured steps first")
    parser.add_argument("--steps", type=int, default=DEFAULT_WINDOW_STEPS, help="measured window")
    args = parser.parse_args()
    config = api.configure(model="llama2-7b", gpu="h100-sxm", tp=8, pp=4, dp=4, max_context=131072,
                           global_batch_tokens=4 * 2**20)
    print(f"Reproduce: `python {' '.join(sys.argv)}`\n")
    print("| dataset | fixed | kk | whole-sample SlimPack | kk, equal counts | whole-sample SlimPack, equal counts "
          "| full plan lowered | full SlimPack (runtime) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in DATASETS:
        began = time.perf_counter()
        window = {"warmup": args.warmup, "steps": args.steps}
        full = api.compare(name, config, ["fixed", "kk", "slimpack"], **window)
        whole = api.compare(name, whole_sample_config(config), ["slimpack"], **window)
        rows = {row.strategy: row for row in full.table()}
        kk = rows["kk"].tokens_per_s
        cells = [rows["fixed"].tokens_per_s, kk, whole.table()[0].tokens_per_s,
                 transformed_tokens_per_s(full.runs[1], equal_count_form),
                 transformed_tokens_per_s(whole.runs[0], equal_count_form),
                 transformed_tokens_per_s(full.runs[2], whole_sample_form), rows["slimpack"].tokens_per_s]
        oom = {**{row.strategy: row.oom_steps for row in rows.values()}, "whole-sample": whole.table()[0].oom_steps}
        print(f"| {name} | " + " | ".join(c if isinstance(c, str) else f"{c / kk:.3f}x" for c in cells) + " |",
              flush=True)
        print(f"<!-- {name}: kk {kk:,.0f} tokens/s; OOM steps as planned {oom}; "
              f"{time.perf_counter() - began:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
