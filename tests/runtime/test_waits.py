"""``WaitMonitor``: a named wait that outlives the timeout ends the process with one line; a wait that
finishes in time, or no wait at all, never does. ``SLIMPACK_FAULT`` sleeps only where it says."""

from __future__ import annotations

import threading
import time

import pytest

from slimpack.runtime.distributed import ranks_text
from slimpack.runtime.waits import WaitMonitor, fault_point


class _Aborts:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.fired = threading.Event()

    def __call__(self, message: str) -> None:
        self.messages.append(message)
        self.fired.set()


def test_a_wait_past_the_timeout_names_rank_action_and_peer():
    aborts = _Aborts()
    monitor = WaitMonitor(0.2, 4, abort=aborts)
    began = time.monotonic()
    with monitor.waiting("step 3: receiving F2 from rank 1", "rank 1"):
        assert aborts.fired.wait(5)
    elapsed = time.monotonic() - began
    monitor.close()
    assert aborts.messages == ["slimpack: rank 4: step 3: receiving F2 from rank 1 did not finish within 0.2 s "
                               "(--timeout); rank 1 has died or hangs. Aborting the job."]
    assert 0.2 <= elapsed < 2.0


def test_waits_that_finish_in_time_and_idle_time_never_abort():
    aborts = _Aborts()
    monitor = WaitMonitor(0.3, 0, abort=aborts)
    for _ in range(5):  # 0.5 s of waits, each shorter than the timeout
        with monitor.waiting("step 0: the loss all-reduce", "rank 1"):
            time.sleep(0.1)
    time.sleep(0.5)  # longer than the timeout, but outside any wait
    monitor.close()
    assert aborts.messages == []


def test_ranks_text():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([1, 2]) == "one of ranks 1, 2"


def test_fault_point_sleeps_only_on_its_rank_and_point(monkeypatch):
    monkeypatch.setenv("SLIMPACK_FAULT", "1:send:0.3")
    began = time.monotonic()
    fault_point("send", 0)
    fault_point("loss all-reduce", 1)
    assert time.monotonic() - began < 0.25
    fault_point("send", 1)
    assert time.monotonic() - began >= 0.3
    monkeypatch.setenv("SLIMPACK_FAULT", "1:sned:1")
    with pytest.raises(ValueError, match="sned"):
        fault_point("send", 1)
