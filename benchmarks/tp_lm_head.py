"""Tensor-parallel LM head on CPU: vocabulary-parallel loss (torch's ``loss_parallel``) against
all-gathered logits, 2 gloo ranks. The figures in docs/runtime.md ("Tensor parallelism").

    PYTHONPATH=src python benchmarks/tp_lm_head.py [--vocab 32000] [--tokens 2048] [--repeats 5]

The tiny model's layers with a larger vocabulary, float32, one stage holding everything, one group of
``--tokens`` tokens (4 documents); each repeat runs its forward and backward. Reports the fastest
repeat per rank (the slower rank's) and the peak bytes kept for backward.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from slimpack.runtime.launch import spawn


def _rank(rank: int, world_size: int, vocab: int, tokens: int, repeats: int) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from slimpack.config import model_preset
    from slimpack.plan.types import Slice
    from slimpack.runtime.executor import StageExecutor
    from slimpack.runtime.memory import ActivationTracker
    from slimpack.runtime.model import build_model
    from slimpack.runtime.tensor_parallel import loss_context, parallelize_model
    from slimpack.runtime.verify import random_tokens

    config = dataclasses.replace(model_preset("tiny"), vocab_size=vocab)
    mesh = init_device_mesh("cpu", (world_size,))
    per = tokens // 4
    lengths = {i: per for i in range(4)}
    ids = random_tokens(lengths, vocab, 0)
    groups = (tuple(Slice(i, 0, per) for i in range(4)),)
    out = {}
    for vocab_parallel in (True, False):
        net = parallelize_model(build_model(config, dtype=torch.float32), mesh, vocab_parallel=vocab_parallel)
        (stage,) = net.split(1)
        times, peak = [], 0
        with loss_context(world_size):
            for i in range(repeats + 1):
                tracker = ActivationTracker(exclude=list(net.parameters())) if i == repeats else None
                executor = StageExecutor(stage, groups, groups, sample_lengths=lengths, tokens=ids, backend="cpu",
                                         tracker=tracker)
                began = time.perf_counter()
                executor.forward(0)
                executor.backward(0)
                if tracker is None:
                    times.append(time.perf_counter() - began)
                else:
                    peak = tracker.peak_bytes
        out["vocab-parallel" if vocab_parallel else "gathered"] = {"time_s": min(times), "peak_bytes": peak}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = spawn(_rank, 2, (args.vocab, args.tokens, args.repeats), timeout_s=3600)
    print(f"tp 2, vocabulary {args.vocab}, {args.tokens} tokens, float32, gloo on CPU")
    print("| LM head | forward + backward (s) | peak kept per rank (MiB) |")
    print("|---|---:|---:|")
    for mode in ("vocab-parallel", "gathered"):
        slowest = max(r[mode]["time_s"] for r in results)
        peak = max(r[mode]["peak_bytes"] for r in results)
        print(f"| {mode} | {slowest:.3f} | {peak / 2**20:.2f} |")


if __name__ == "__main__":
    main()
