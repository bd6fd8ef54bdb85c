"""``benchmarks/gpu_check.py``: without a GPU it says so and measures nothing; its CPU-runnable parts
(``--device cpu``, tiny sizes) produce a report whose figures hold together and a loadable preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slimpack.config.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    proc = _run("--out", str(tmp_path / "report.json"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpu_check: this machine has no CUDA GPU")
    assert not (tmp_path / "report.json").exists()


@pytest.mark.slow
def test_cpu_parts_report_and_preset(tmp_path):
    proc = _run("--device", "cpu", "--repeats", "1", "--out", "report.json", "--preset-dir", "presets", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    numerics = report["numerics"]
    assert numerics["backend"] == "cpu" and numerics["max_gradient_relative"] < 1e-4  # float32 vs float64
    assert numerics["loss_relative"] < 1e-5
    rows = report["throughput"]["rows"]
    assert [r["slices"] for r in rows] == [1, 4] and rows[0]["relative"] == 1.0
    assert report["throughput"]["worst_relative"] == min(r["relative"] for r in rows)
    memory = report["memory"]
    # the executor keeps what the cost model counts, plus the small extras docs/runtime.md itemises
    assert all(0 <= r["error"] < 0.02 for r in memory["rows"]) and memory["mape"] < 0.02
    preset = Path(report["calibrate"]["preset"])
    config = load_config(tmp_path / preset)
    assert config.cluster.name == "measured-cpu" and config.model.name == "tiny"
    origin = json.loads((tmp_path / preset).with_suffix(".provenance.json").read_text())
    assert origin["versions"]["torch"] == torch.__version__ and "--device cpu" in origin["command"]
