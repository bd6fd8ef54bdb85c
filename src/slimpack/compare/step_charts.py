"""Charts of single steps of a comparison: tokens/s step by step, and one common step's Gantt for
every strategy with a zoom on SlimPack's groups (matplotlib, Agg). Must not import torch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from slimpack.compare.run import StepRecord, StrategyRun  # noqa: E402
from slimpack.sim.plots import draw_gantt  # noqa: E402

ZOOM_STRATEGY = "slimpack"
ZOOM_FRACTION = 0.08
"""Share of the step the zoom panel shows: narrow enough for group numbers to fit on the boxes."""


def step_throughput_chart(runs: Sequence[StrategyRun], path: Path) -> None:
    """Tokens/s of every measured step, one line per strategy: a mean over the window hides
    whether one strategy is steadily ahead or wins on a few steps."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    drawn = False
    for run in runs:
        ok = [s for s in run.ok_steps if s.result is not None and s.result.step_time_s > 0]
        if not ok:
            continue
        ax.plot([s.step for s in ok], [s.scheduled_tokens / s.result.step_time_s / 1e3 for s in ok],  # type: ignore[union-attr]
                marker="o", markersize=3, linewidth=1.4 if run.name == ZOOM_STRATEGY else 1.0, label=run.name)
        drawn = True
    if not drawn:
        plt.close(fig)
        return
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step (measured window)")
    ax.set_ylabel("thousand tokens / s")
    ax.set_title("Simulated throughput of each measured step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def common_step(runs: Sequence[StrategyRun]) -> int | None:
    """The step every Gantt panel shows: SlimPack's median window step (the first strategy's when
    SlimPack did not run), so all panels show the same batch."""
    ranked = sorted(runs, key=lambda run: run.name != ZOOM_STRATEGY)
    for run in ranked:
        record = run.representative()
        if record is not None:
            return record.step
    return None


def _record_at(run: StrategyRun, step: int) -> StepRecord | None:
    return next((s for s in run.ok_steps if s.step == step and s.result is not None), None)


def gantt_chart(runs: Sequence[StrategyRun], path: Path, max_pipelines: int = 2) -> int | None:
    """Step ``common_step`` of every strategy on one time axis, and a zoom on a window of SlimPack's
    step in which its groups can be told apart. Returns the step shown (None: nothing to draw)."""
    step = common_step(runs)
    if step is None:
        return None
    shown = [(run, _record_at(run, step)) for run in runs]
    shown = [(run, rec) for run, rec in shown if rec is not None]
    zoom = next((rec for run, rec in shown if run.name == ZOOM_STRATEGY), None)
    pp = len(shown[0][1].result.peak_memory_bytes)  # type: ignore[union-attr]
    rows = [min(max_pipelines, len({s.pipeline for s in rec.result.spans})) * pp for _, rec in shown]  # type: ignore[union-attr]
    heights = [r + 3 for r in rows] + ([pp + 3] if zoom else [])
    fig, axes = plt.subplots(len(heights), 1, figsize=(13, sum(0.32 * h + 0.3 for h in heights) + 0.5),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    end = max(rec.result.step_time_s for _, rec in shown)  # type: ignore[union-attr]
    for ax, (run, rec) in zip(axes[:, 0], shown, strict=False):
        result = rec.result
        assert result is not None
        draw_gantt(ax, result, max_pipelines=max_pipelines, time_range=(0.0, end * 1.01),
                   title=f"{run.name}: step {step}, {result.step_time_s:.2f} s, {rec.scheduled_tokens:,} tokens, "
                         f"efficiency {result.efficiency:.3f}")
    if zoom is not None:
        result = zoom.result
        assert result is not None
        middle = result.step_time_s * 0.5
        half = result.step_time_s * ZOOM_FRACTION / 2
        draw_gantt(axes[-1, 0], result, max_pipelines=1, time_range=(middle - half, middle + half),
                   title=f"{ZOOM_STRATEGY}, step {step}, pipeline 0: zoom on {middle - half:.2f}-{middle + half:.2f} s "
                         f"(numbers: forward / backward group)")
    missing = [run.name for run in runs if _record_at(run, step) is None]
    if missing:
        fig.text(0.01, 0.002, f"not shown (no result on step {step}): {', '.join(missing)}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return step
