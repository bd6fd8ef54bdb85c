"""Chrome trace export and the Gantt / memory plots."""

import json
import re
import subprocess
import sys
from collections import Counter

import pytest
from matplotlib.figure import Figure

from helpers import config, one_sample_per_group_plan
from slimpack.sim import chrome_trace, simulate
from slimpack.sim.plots import draw_gantt, gantt, memory_timeline


@pytest.fixture(scope="module")
def result(small_plan):
    return simulate(small_plan)


def test_trace_layout_and_units(result):
    trace = json.loads(json.dumps(chrome_trace(result), allow_nan=False))
    events = trace["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M" and "name" in e["args"]}
    assert names[(0, None)] == "pipeline 0" and names[(1, None)] == "pipeline 1"
    assert names[(1, 0)] == "stage 0" and names[(1, 1)] == "stage 1"
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(result.spans)
    for event, span in zip(complete, result.spans, strict=True):
        assert (event["pid"], event["tid"]) == (span.pipeline, span.stage)
        assert event["ts"] == span.start_s * 1e6
        assert event["dur"] == pytest.approx((span.end_s - span.start_s) * 1e6)
        if span.kind in ("F", "B"):
            assert event["name"] == f"{span.kind}{span.group}"
            assert event["args"] == {"group": span.group, "chunk": 0, "tokens": span.tokens}
        else:
            assert event["name"] == {"sync": "grad sync", "optim": "optimizer"}[span.kind]
    counters = Counter((e["pid"], e["name"]) for e in events if e["ph"] == "C")
    assert counters == {(m.pipeline, f"memory stage {m.stage}"): len(m.times_s) for m in result.memory}
    peak = max(e["args"]["GiB"] for e in events if e["ph"] == "C")
    assert peak == pytest.approx(max(result.peak_memory_bytes) / 2**30)
    assert trace["otherData"]["step_time_s"] == result.step_time_s


def test_trace_names_chunks_of_interleaved_schedules():
    cfg = config(pp=2, vpp=2)
    events = chrome_trace(simulate(one_sample_per_group_plan(cfg, 4, length=512)))["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"F0", "F0.1", "B3", "B3.1"} <= names
    assert all(re.fullmatch(r"[FB]\d+(\.\d+)?|grad sync|optimizer", n) for n in names)


def test_gantt_draws_into_given_axes(result):
    fig = Figure(figsize=(12, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1)
    draw_gantt(top, result)
    draw_gantt(bottom, result, max_pipelines=1, title="only pipeline 0")
    assert [t.get_text() for t in top.get_yticklabels()] == ["p0 s0", "p0 s1", "p1 s0", "p1 s1"]
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["p0 s0", "p0 s1"]
    assert top.get_title().startswith(f"fixed, step 1: {result.step_time_s:.3f} s, efficiency")
    assert bottom.get_title() == "only pipeline 0"
    assert top.get_xlim() == (0.0, result.step_time_s)
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert legend == ["forward", "backward", "grad sync", "optimizer", "idle"]
    labels = [t.get_text() for t in top.texts]
    assert labels and all(text.isdigit() for text in labels)  # group numbers on the wide boxes


@pytest.mark.parametrize("size", [(8.0, 0.5), (0.3, 6.0)], ids=["thin rows", "narrow boxes"])
def test_gantt_leaves_out_labels_that_do_not_fit(result, size):
    ax = Figure(figsize=size).add_subplot()
    draw_gantt(ax, result)
    assert len(ax.texts) == 0


def test_plot_files(result, tmp_path):
    gantt(result, tmp_path / "g.png")
    memory_timeline(result, tmp_path / "m.png")
    for name in ("g.png", "m.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_plots_and_the_simulator_need_neither_pyplot_nor_torch():
    code = ("import sys, slimpack.sim.plots, slimpack.plan, slimpack.schedule, slimpack.cli.main; "
            "print(sorted(m for m in ('torch', 'matplotlib.pyplot') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
