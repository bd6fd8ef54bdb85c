"""Start a function on N local processes with an initialised gloo process group, without torchrun.

Used by the tests and by ``slimpack fidelity``: ``spawn(fn, world_size, args, timeout_s=…)`` runs
``fn(rank, world_size, *args)`` in fresh (spawned) interpreters, rendezvous through a file in a
temporary directory, and returns each rank's return value (pickled through a file, so a rank that
dies leaves no half-read queue behind). A rank that fails or exits without a result, or a run that
outlives ``timeout_s``, raises ``LaunchError`` with every rank's exit code and the first error; the
remaining processes are killed, never left running.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class LaunchError(RuntimeError):
    """A rank failed, died, or the run timed out. ``results`` holds, by rank, the value of each rank
    that did return one (None for the others)."""

    def __init__(self, message: str, results: list[Any]) -> None:
        super().__init__(message)
        self.results = results


def _child(fn: Callable[..., Any], rank: int, world_size: int, args: Sequence[Any], workdir: str,
           pg_timeout_s: float, threads: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    out = Path(workdir) / f"rank{rank}.pkl"
    try:
        dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=pg_timeout_s))
        value = fn(rank, world_size, *args)
        out.write_bytes(pickle.dumps(("ok", value)))
    except BaseException as exc:  # report every failure, then exit non-zero
        out.write_bytes(pickle.dumps(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
        os._exit(1)
    with contextlib.suppress(Exception):  # a peer may already be gone; the result is written
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *, timeout_s: float = 120.0,
          pg_timeout_s: float = 60.0, threads: int = 1) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; their return values by rank."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="slimpack-launch-") as workdir:
        procs = [context.Process(target=_child, args=(fn, rank, world_size, tuple(args), workdir, pg_timeout_s,
                                                      threads), daemon=True)
                 for rank in range(world_size)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout_s
        try:
            for proc in procs:
                proc.join(max(deadline - time.monotonic(), 0.0))
        finally:
            alive = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
        results: list[Any] = []
        partial: list[Any] = []
        errors: list[str] = []
        for rank, proc in enumerate(procs):
            path = Path(workdir) / f"rank{rank}.pkl"
            status, value = pickle.loads(path.read_bytes()) if path.exists() else ("missing", None)
            partial.append(value if status == "ok" else None)
            if status == "ok":
                results.append(value)
            elif status == "error":
                errors.append(f"rank {rank}: {value}")
            else:
                errors.append(f"rank {rank}: exited with code {proc.exitcode} and no result")
        if alive:
            raise LaunchError(f"ranks {alive} still running after {timeout_s:.0f} s (killed); " + "; ".join(errors),
                              partial)
        if errors:
            raise LaunchError(errors[0] if len(errors) == 1 else "\n".join(errors), partial)
        return results
