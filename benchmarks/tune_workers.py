"""How ``tune``'s wall time would scale with more workers on as many cores, estimated by replaying
its scheduler on a virtual clock (docs/tune.md, "Workers").

Each trial runs once, in this process, and its CPU seconds are its duration. The search hands trials
out exactly as ``tune`` does (``tune.search._run``, with this clock in place of the worker pool): a
trial handed out at virtual time t ends at t + its duration, and the search hears of the earliest
end first. A trial that a larger worker count screens ahead is run when first asked for, so every
worker count replays the trials it would really run. An estimate, not a measurement: it leaves out
the workers' start-up, their contention for memory bandwidth and caches, and the parent's own work.

    python benchmarks/tune_workers.py --dataset pydocs --context 128K --gpus 256 --workers 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import Future
from unittest import mock

from slimpack.config import Config, TrainConfig, build_config
from slimpack.data import Dataset, load_dataset
from slimpack.strategies import STRATEGIES
from slimpack.tune import TuneResult, search, tune
from slimpack.tune.trials import Task, Trial, run_trial

CONTEXTS = {"64K": 65536, "128K": 131072, "256K": 262144}
TOKENS_PER_GPU = 65536

Ran = dict[tuple, tuple[Trial, float]]
"""Each trial run so far, by what it ran, with its CPU seconds."""


class VirtualPool:
    """``tune.trials.Trials`` on a virtual clock: ``submit`` runs the trial (or recalls it) and
    schedules its end; ``wait`` moves the clock to the earliest end among the trials running."""

    def __init__(self, dataset: Dataset, workers: int, ran: Ran) -> None:
        self.dataset, self.workers, self.ran = dataset, workers, ran
        self.now = 0.0
        self.busy = 0.0
        """CPU seconds of the trials handed out."""
        self.ends: dict[Future[Trial], float] = {}

    def submit(self, task: Task) -> Future[Trial]:
        key = (task.strategy, task.layout.label(), task.phase, task.window)
        if key not in self.ran:
            began = time.process_time()
            trial = run_trial(task, self.dataset)
            self.ran[key] = trial, time.process_time() - began
        trial, seconds = self.ran[key]
        future: Future[Trial] = Future()
        future.set_result(trial)
        self.ends[future] = self.now + seconds
        self.busy += seconds
        return future

    def wait(self, running, return_when=None) -> tuple[set, set]:
        self.now = min(self.ends[f] for f in running)
        done = {f for f in running if self.ends[f] <= self.now}
        return done, set(running) - done

    def close(self) -> None:
        pass


def replay(base: Config, dataset: Dataset, gpus: int, workers: int, ran: Ran, time_limit_s: float | None = None
           ) -> tuple[float, float, TuneResult]:
    """(virtual wall seconds, CPU seconds of the trials handed out, the search's result); the search
    reads the virtual clock, so a time limit is one of virtual seconds."""
    pools: list[VirtualPool] = []

    def make_pool(data: Dataset, n: int) -> VirtualPool:
        pools.append(VirtualPool(data, n, ran))
        return pools[-1]

    clock = mock.Mock(perf_counter=lambda: pools[-1].now if pools else 0.0)
    with mock.patch.object(search, "Trials", make_pool), mock.patch.object(search, "time", clock), \
            mock.patch.object(search, "wait", lambda running, return_when: pools[-1].wait(running)):
        result = tune(base, dataset, gpus, list(STRATEGIES), workers=workers, time_limit_s=time_limit_s)
    return pools[-1].now, pools[-1].busy, result


def add_cell_arguments(parser: argparse.ArgumentParser, *, dataset: str) -> None:
    """The cell a replay searches: model, dataset, context and GPUs (64K tokens per GPU a batch)."""
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--dataset", default=dataset)
    parser.add_argument("--context", default="128K", choices=CONTEXTS)
    parser.add_argument("--gpus", type=int, default=256)


def cell(args: argparse.Namespace) -> tuple[Config, Dataset]:
    """The base config and dataset of ``add_cell_arguments``' cell."""
    base = build_config(model=args.model, train=TrainConfig(max_context=CONTEXTS[args.context],
                                                            global_batch_tokens=TOKENS_PER_GPU * args.gpus))
    return base, load_dataset(args.dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(parser, dataset="pydocs")
    parser.add_argument("--workers", default="1,2,4,8,16")
    args = parser.parse_args()
    base, dataset = cell(args)
    ran: Ran = {}
    print("| workers (= cores) | estimated wall s | CPU-s of the trials handed out | picks as with 1 worker |\n"
          "|---:|---:|---:|---|", flush=True)
    first = None
    for workers in map(int, args.workers.split(",")):
        wall, busy, result = replay(base, dataset, args.gpus, workers, ran)
        picks = {s.strategy: f"{s.best.layout.label()} {s.best.tokens_per_s:,.0f}" if s.best else "none"
                 for s in result.strategies}
        first = first or picks
        print(f"| {workers} | {wall:.0f} | {busy:.0f} | {'yes' if picks == first else picks} |", flush=True)


if __name__ == "__main__":
    main()
