"""``torchrun -m slimpack train`` on 2 processes (pp 2, tp 2 or cp 2) gives the same losses as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimpack.cli.main import main

pytestmark = pytest.mark.distributed

FLAGS = ["--steps", "2", "--max-context", "256", "--global-batch-tokens", "1024", "--dtype", "float64",
         "--strategy", "slimpack"]


@pytest.mark.parametrize("layout", [["--pp", "2"], ["--tp", "2"], ["--cp", "2"]])
def test_two_ranks_under_torchrun_match_one_process(tmp_path, monkeypatch, layout):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = tmp_path / "one.json"
    assert main(["train", *FLAGS, "--log-json", str(one)]) == 0
    two = tmp_path / "two.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "slimpack", "train", *FLAGS, *layout,
                           "--log-json", str(two), "--trace-dir", str(tmp_path / "traces"), "--timeout", "60"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 1: loss" in proc.stdout
    expected = [r["loss"] for r in json.loads(one.read_text())]
    got = [r["loss"] for r in json.loads(two.read_text())]
    assert got == pytest.approx(expected, rel=1e-10)
    rows = []
    for rank in (0, 1):
        trace = json.loads((tmp_path / "traces" / f"rank{rank}.json").read_text())
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "forward"]
        assert spans and {e["tid"] for e in spans} == {rank if layout[0] == "--pp" else 0}  # the rank's stage
        assert set(spans[0]) == {"ph", "name", "cat", "pid", "tid", "ts", "dur", "args"}
        rows.append(sum(e["args"]["tokens"] for e in spans))
    trained = sum(r["tokens"] for r in json.loads(two.read_text()))
    if layout[0] == "--tp":
        assert rows == [trained, trained]  # every tensor-parallel rank runs every token
    elif layout[0] == "--cp":
        assert sum(rows) == trained and abs(rows[0] - rows[1]) <= 0.05 * trained  # each its zigzag share
