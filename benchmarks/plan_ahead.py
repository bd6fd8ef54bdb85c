"""Does planning ahead cost training time? Step time of the tiny model on CPU with plans made on
the loader's background thread (``PlanningLoader(ahead=True)``) vs with every plan computed before
training starts; the same steps in both modes, modes alternated over rounds. One process
(pp = dp = 1, gloo group of one), float32, CPython stdlib text.

    PYTHONPATH=src python benchmarks/plan_ahead.py [--steps 8] [--rounds 2] [--strategy slimpack]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from slimpack.config import TrainConfig, build_config
from slimpack.data.text import TextCorpus
from slimpack.runtime.distributed import RankRuntime
from slimpack.runtime.loader import PlanningLoader
from slimpack.runtime.mesh import Mesh
from slimpack.runtime.model import build_model


def run_mode(corpus: TextCorpus, config, strategy: str, steps: int, ahead: bool | None) -> list[tuple[float, float, float]]:
    """Per step (wall incl. waiting for the plan, runtime.step time, planner time); ``ahead=None``:
    plans precomputed before the first step."""
    loader = PlanningLoader(corpus.dataset(), config, strategy, ahead=bool(ahead))
    items = [next(loader) for _ in range(steps)] if ahead is None else None
    model = build_model(config.model, seed=0, dtype=torch.float32)
    runtime = RankRuntime(model, Mesh(dp=1, pp=1), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    out = []
    for i in range(steps):
        began = time.perf_counter()
        item = items[i] if items is not None else next(loader)
        tokens = {sid: torch.frombuffer(bytearray(corpus.sample_tokens(s, config.train.max_context)),
                                        dtype=torch.uint8).long()
                  for sid, s in item.sources.items()}
        step_began = time.perf_counter()
        runtime.step(item.plan, tokens)
        end = time.perf_counter()
        out.append((end - began, end - step_began, item.planner_time_s))
    loader.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--strategy", default="slimpack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=300))
        config = build_config(model="tiny", train=TrainConfig(max_context=2048, global_batch_tokens=16384,
                                                              recompute="none"))
        corpus = TextCorpus.stdlib()
        results: dict[str, list[tuple[float, float, float]]] = {"precomputed": [], "ahead": []}
        for _ in range(args.rounds):
            for name, ahead in (("precomputed", None), ("ahead", True)):
                results[name] += run_mode(corpus, config, args.strategy, args.steps, ahead)[1:]  # step 0: warm-up
        print(f"tiny model, float32, {torch.get_num_threads()} torch threads, strategy {args.strategy}, "
              f"max_context 2048, 16384 tokens/batch, {args.rounds} rounds x {args.steps - 1} timed steps")
        print("| mode | wall per step (s) | runtime.step (s) | planner (ms) |")
        print("|---|---:|---:|---:|")
        for name, rows in results.items():
            wall, step, plan = zip(*rows, strict=True)
            print(f"| {name} | {statistics.mean(wall):.3f} ± {statistics.stdev(wall):.3f} | "
                  f"{statistics.mean(step):.3f} ± {statistics.stdev(step):.3f} | {statistics.mean(plan) * 1e3:.1f} |")
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
