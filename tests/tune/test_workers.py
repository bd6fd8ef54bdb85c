"""How many worker processes ``tune`` starts unless told: one per CPU it may use, within a cgroup
quota, at most MAX_DEFAULT_WORKERS."""

from __future__ import annotations

import os

import pytest

from slimpack.tune.trials import MAX_DEFAULT_WORKERS, default_workers


@pytest.fixture
def cpus(monkeypatch):
    """Pretend this process may run on ``n`` CPUs."""
    def set_cpus(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    return set_cpus


@pytest.mark.parametrize(("affinity", "cpu_max", "expected"), [
    (16, None, MAX_DEFAULT_WORKERS),      # no cgroup file: the affinity, capped
    (6, None, 6),
    (1, None, 1),
    (16, "max 100000\n", MAX_DEFAULT_WORKERS),  # no quota set
    (64, "200000 100000\n", 2),           # a container given two of the host's 64 cores
    (64, "150000 100000\n", 1),           # 1.5 CPUs: one whole one
    (64, "50000 100000\n", 1),            # half a CPU: still one worker
    (3, "800000 100000\n", 3),            # a quota above the affinity: the affinity
    (16, "garbage\n", MAX_DEFAULT_WORKERS),  # unreadable: no quota
    (16, "100000 0\n", MAX_DEFAULT_WORKERS),
])
def test_default_workers(cpus, tmp_path, affinity, cpu_max, expected):
    cpus(affinity)
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    assert default_workers(path) == expected

