"""Sliced vs unsliced throughput for the same tokens (the per-group overhead figures in docs/runtime.md).

    PYTHONPATH=src python benchmarks/slice_overhead.py [--tokens 1024] [--slices 1 4 16 64]
        [--model tiny] [--dtype float32] [--backend cpu] [--device cpu] [--repeats 5] [--profile]

One sample of ``--tokens`` tokens runs forward and backward through the stage executor unsliced and
cut into each ``--slices`` count (each slice its own forward and backward group,
``runtime.throughput``). Prints per count: ms per step, tokens/s, throughput relative to unsliced,
the extra ms per extra group per layer, and what the same number of slice-sized samples cost run
alone (unsliced, no prefix: the floor of running groups that small). ``--profile`` adds a cProfile of the largest count
(top functions by own time), which is how the Python work per cell and layer was found.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from slimpack.config import model_preset
from slimpack.runtime import build_model
from slimpack.runtime.throughput import slice_throughput, sliced_pipeline, time_step

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--slices", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(model_preset(args.model), seed=0, dtype=DTYPES[args.dtype], device=args.device)
    rows = slice_throughput(model, args.tokens, args.slices, backend=args.backend, repeats=args.repeats)
    print(f"{args.tokens} tokens, model {args.model} ({model.config.num_layers} layers), {args.dtype}, "
          f"backend {args.backend}, {args.device}, {args.threads} thread(s), best of {args.repeats}")
    print(f"{'slices':>6} {'ms/step':>9} {'tokens/s':>10} {'vs unsliced':>12} {'ms/group/layer':>15} "
          f"{'slices alone ms':>16}")
    for r in rows:
        print(f"{r.slices:>6} {r.seconds * 1e3:>9.1f} {r.tokens_per_s:>10,.0f} {r.relative:>12.3f} "
              f"{r.per_group_layer_ms:>15.3f} {r.alone_s * 1e3:>16.1f}")
    if args.profile:
        most = max(args.slices)
        tokens = torch.randint(0, model.config.vocab_size, (args.tokens,)).to(args.device)
        print(f"\ncProfile of {most} slices ({len(sliced_pipeline(args.tokens, most).forward)} groups), by own time:")
        profiler = cProfile.Profile()
        profiler.runcall(time_step, model, tokens, most, backend=args.backend, repeats=1)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
