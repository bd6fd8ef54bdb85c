"""Every wait on another rank runs under a deadline: a dead or hung peer ends the job with one line.

A receive, a send's completion, a barrier or an all-reduce waits for other ranks. A peer that dies
usually makes gloo raise at once ("connection closed"), but a peer that hangs without dying (stopped,
deadlocked, stuck in I/O) leaves the others blocked inside the collective for the process-group
timeout, and then ends them with a raw backend traceback from whichever collective it was; NCCL may
wait forever. So the runtime names each wait before entering it (``WaitMonitor.waiting("step 3:
receiving F2 from rank 1")``) and one monitor thread per process checks the wait in progress: once
it has lasted ``timeout_s``, the process prints one line naming this rank, the action and the peer
rank(s) it waits on, and exits with ``EXIT_PEER_FAILURE`` (torchrun then stops the other ranks).
Entering and leaving a wait is two attribute writes, so every action can be covered.

The process group's own timeout is set above ``timeout_s`` (``process_group_timeout``) so that for a
hang this message, not the backend's, comes first.

Waits on NCCL are asynchronous to the host (the host only enqueues); there a hang shows at the next
host synchronisation the runtime makes, the step's loss read-back, which is covered too.

``SLIMPACK_FAULT=RANK:POINT:SECONDS`` (tests only) makes rank RANK sleep SECONDS when it reaches
POINT (one of ``FAULT_POINTS``) outside any watched wait, as a hung rank would: the others must
report it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

EXIT_PEER_FAILURE = 3
FAULT_POINTS = ("barrier", "send", "gradient all-reduce", "loss all-reduce")
# Extra time the backend gets beyond the monitor's deadline before it raises on its own.
BACKEND_MARGIN_S = 30.0


def process_group_timeout(timeout_s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_s + BACKEND_MARGIN_S)


def _abort(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_PEER_FAILURE)


class WaitMonitor:
    """One thread that ends the process when the named wait in progress outlives ``timeout_s``.

    ``abort(message)`` is what happens then (default: print the line, exit ``EXIT_PEER_FAILURE``).
    """

    def __init__(self, timeout_s: float, rank: int, *, abort: Callable[[str], None] = _abort) -> None:
        self.timeout_s, self.rank, self._abort = timeout_s, rank, abort
        self._current: tuple[str, str, float] | None = None  # (action, peers, monotonic start)
        self._stop = threading.Event()
        # polling at a tenth of the timeout bounds the overshoot at 10%
        self._poll_s = min(1.0, timeout_s / 10)
        self._thread = threading.Thread(target=self._watch, name="slimpack-wait-monitor", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def waiting(self, action: str, peers: str) -> Iterator[None]:
        """Watch ``action`` (e.g. "step 3: receiving F2") that waits on ``peers`` (e.g. "rank 1")."""
        self._current = (action, peers, time.monotonic())
        try:
            yield
        finally:
            self._current = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            current = self._current
            if current is not None and time.monotonic() - current[2] >= self.timeout_s:
                action, peers, _ = current
                self._abort(f"slimpack: rank {self.rank}: {action} did not finish within {self.timeout_s:g} s "
                            f"(--timeout); {peers} has died or hangs. Aborting the job.")
                return


def fault_point(point: str, rank: int) -> None:
    """Sleep here if ``SLIMPACK_FAULT`` names this rank and point (fault injection for tests)."""
    spec = os.environ.get("SLIMPACK_FAULT")
    if not spec:
        return
    fault_rank, fault, seconds = spec.split(":")
    if fault not in FAULT_POINTS:
        raise ValueError(f"SLIMPACK_FAULT={spec}: the point must be one of {', '.join(FAULT_POINTS)}")
    if int(fault_rank) == rank and fault == point:
        time.sleep(float(seconds))
