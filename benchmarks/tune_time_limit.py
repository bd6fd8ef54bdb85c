"""How close ``tune --time-limit`` comes to the exact search, replayed on a virtual clock (docs/tune.md,
"A time limit").

The search runs once without a limit, each trial in this process with its CPU seconds as its
duration (``tune_workers.replay``); then with each limit, on the same clock (the trials it shares
with the full search are recalled, the others run when first asked for). Per limit: the virtual
wall seconds, and each strategy's pick over the exact search's. An estimate, not a measurement:
worker start-up, contention between workers and the parent's own work are left out.

    python benchmarks/tune_time_limit.py --dataset wikipedia --context 128K --gpus 256 --limits 120,180
"""

from __future__ import annotations

import argparse

from tune_workers import Ran, add_cell_arguments, cell, replay

from slimpack.tune import TuneResult


def picks(result: TuneResult) -> dict[str, float]:
    return {s.strategy: s.best.tokens_per_s if s.best else 0.0 for s in result.strategies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(parser, dataset="wikipedia")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limits", default="120,180", help="comma-separated (virtual) seconds")
    args = parser.parse_args()
    base, dataset = cell(args)
    ran: Ran = {}
    exact_s, _, result = replay(base, dataset, args.gpus, args.workers, ran)
    exact = picks(result)
    print(f"{args.dataset} {args.context}, {args.gpus} GPUs, {args.workers} workers: the exact search takes "
          f"{exact_s:.0f} s (virtual)\n\n| limit s | virtual wall s | "
          + " | ".join(f"{name} / exact" for name in exact) + " |\n|---:|---:|" + "---:|" * len(exact), flush=True)
    for limit in map(float, args.limits.split(",")):
        wall, _, result = replay(base, dataset, args.gpus, args.workers, ran, limit)
        got = picks(result)
        print(f"| {limit:.0f} | {wall:.0f} | " + " | ".join(f"{got[name] / exact[name]:.3f}" if exact[name] else "-"
                                                          for name in exact) + " |", flush=True)


if __name__ == "__main__":
    main()
