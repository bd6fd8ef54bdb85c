"""The scripts in examples/ run as a user runs them (a subprocess, from another directory) and print
real figures: checked here against the API in this process and against invariants they must hold."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slimpack import api
from slimpack.data import GlobalBatchSampler, SamplerConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SRC = Path(__file__).resolve().parents[1] / "src"


def run_example(name: str, cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_example_is_tested():
    tested = {"plan_a_batch.py", "compare_strategies.py", "hf_padding_free.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_plan_a_batch(tmp_path):
    out = run_example("plan_a_batch.py", tmp_path, "best.json")
    figures = {m[0]: tuple(map(float, m[1:])) for m in
               re.findall(r"^(\w+): step ([\d.]+) s, ideal ([\d.]+) s, efficiency ([\d.]+)", out, re.M)}
    assert set(figures) == {"kk", "slimpack"}
    # kk is deterministic: the script's figures are the API's in this process
    config = api.configure(model="llama2-7b", tp=8, pp=4, dp=2, max_context=32 * 1024,
                           global_batch_tokens=256 * 1024)
    lengths = [30_000, 22_000, 16_384, 9_000, 6_000, 4_000, 3_000] + [1_500] * 12 + [600] * 40
    kk = api.simulate(api.plan_batch(lengths, config, "kk"))
    assert figures["kk"][:2] == (round(kk.step_time_s, 6), round(kk.ideal_time_s, 6))
    # same documents, same ideal; efficiency = ideal / step
    assert figures["slimpack"][1] == figures["kk"][1]
    for step, ideal, efficiency in figures.values():
        assert efficiency == pytest.approx(ideal / step, abs=1e-4) and 0 < efficiency <= 1
    faster = min(figures, key=lambda name: figures[name][0])
    reloaded = re.search(r"faster: (\w+); wrote best.json; reloaded step time ([\d.]+) s", out)
    assert reloaded and reloaded[1] == faster and float(reloaded[2]) == figures[faster][0]
    assert api.load_plan(tmp_path / "best.json").strategy == faster


def test_compare_strategies(tmp_path):
    out = run_example("compare_strategies.py", tmp_path)
    config = api.configure(model="llama2-7b", tp=8, pp=2, dp=2, max_context=32 * 1024,
                           global_batch_tokens=1024 * 1024)
    cut = api.cut_at_context("pydocs", config)
    assert f"pydocs: {cut.describe()}" in out and cut.num_cut_docs == 4
    rows = re.findall(r"^(\w+): ([\d,]+) tokens/s, ([\d.]+)x fixed, efficiency ([\d.]+), (\d+) tokens", out, re.M)
    assert [r[0] for r in rows] == ["fixed", "kk", "slimpack"]
    # the window is steps 1-2 (one warm-up step): every strategy trains those batches' tokens
    sampler = GlobalBatchSampler(api.dataset("pydocs"), SamplerConfig.from_train(config.train))
    window_tokens = sampler.batch_at(1).num_tokens + sampler.batch_at(2).num_tokens
    assert {int(r[4]) for r in rows} == {window_tokens}
    fixed_rate = float(rows[0][1].replace(",", ""))
    assert rows[0][2] == "1.000"
    for _, rate, speedup, efficiency, _ in rows:
        assert float(speedup) == pytest.approx(float(rate.replace(",", "")) / fixed_rate, abs=1e-3)
        assert 0 < float(efficiency) <= 1


def test_hf_padding_free(tmp_path):
    pytest.importorskip("torch")
    out = run_example("hf_padding_free.py", tmp_path)
    per_rank = {int(r): (json.loads(counts), int(loss)) for r, counts, loss in
                re.findall(r"^rank (\d): micro-batches per step (\[[\d, ]+\]), loss tokens of step 0 \(all ranks\) (\d+)",
                           out, re.M)}
    assert set(per_rank) == {0, 1} and per_rank[0] == per_rank[1]  # same micro-batch count on both ranks
    counts, loss_tokens = per_rank[0]
    batches = re.findall(r"^rank (\d) micro-batch (\d+): (\d+) tokens, (\d+) samples, cu_seq_lens \[([\d, ]+)\]",
                         out, re.M)
    step0_tokens = step0_samples = 0
    for _rank, index, tokens, samples, cu in batches:
        bounds = [int(x) for x in cu.split(",")]
        assert bounds[0] == 0 and bounds[-1] == int(tokens) and len(bounds) == int(samples) + 1
        sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        assert min(sizes) >= 1 and max(sizes) <= 512  # whole samples, none over the context
        if int(index) < counts[0]:
            step0_tokens += int(tokens)
            step0_samples += int(samples)
    assert len(batches) == 2 * sum(counts)
    # every sample's first token predicts nothing: the step's loss tokens over both ranks' batches
    assert loss_tokens == step0_tokens - step0_samples
