"""``collector_paused``: Python's cycle collector switched off around allocation-heavy work.

Planning and simulating a step allocate hundreds of thousands of small tuples (slices, groups,
graph edges), and every burst of allocations makes the cycle collector walk every live object:
a third of SlimPack's planning time at 2048 GPUs (p50 1.41 s -> 0.93 s over 25 steps,
docs/planner-latency.md). These structures hold no reference cycles, and reference counting still
frees everything as it goes, so pausing the collector loses no memory that matters.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off inside the block, back to its previous state after (errors too)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
