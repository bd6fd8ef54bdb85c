"""Pictures of a simulated step: a Gantt chart of every device's work and the live memory of every
device over the step.

Built on matplotlib's object API (``Figure``, no pyplot): nothing global changes, and PNGs render
with the Agg backend whatever the user's default backend is, so this runs on headless machines.
``draw_gantt`` draws into a given Axes, so a report can put several strategies side by side.
Must not import torch.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from slimpack.files import output_path
from slimpack.sim.result import DeviceMemory, SimResult
from slimpack.units import GIB

COLORS = {"F": "#4878CF", "B": "#E8853A", "sync": "#3A9E5C", "optim": "#8E5BB5"}
IDLE_COLOR = "#E4E4E4"
LEGEND = {"F": "forward", "B": "backward", "sync": "grad sync", "optim": "optimizer"}
LABEL_POINTS = 6.0
CHAR_WIDTH = 0.62  # width of a digit in font sizes, for DejaVu Sans (matplotlib's default)
DPI = 150


def _title(result: SimResult, extra: str = "") -> str:
    return (f"{result.strategy}, step {result.step}: {result.step_time_s:.3f} s, "
            f"efficiency {result.efficiency:.1%}{extra}")


def draw_gantt(ax: Axes, result: SimResult, *, max_pipelines: int = 8, title: str | None = None,
               time_range: tuple[float, float] | None = None) -> None:
    """One row per device (pipeline x stage, pipeline 0 stage 0 on top), boxes coloured by kind on an
    idle-coloured background, group numbers on the boxes wide enough to hold them. ``time_range``:
    the seconds shown (default the whole step); a narrow one zooms in until the numbers fit."""
    pipelines = sorted({span.pipeline for span in result.spans})
    shown = pipelines[:max_pipelines]
    pp = 1 + max((span.stage for span in result.spans), default=0)
    row_of = {(p, s): k * pp + s for k, p in enumerate(shown) for s in range(pp)}
    boxes: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    labels: list[tuple[float, float, int, str]] = []
    for span in result.spans:
        row = row_of.get((span.pipeline, span.stage))
        if row is None:
            continue
        boxes[(row, span.kind)].append((span.start_s, span.end_s - span.start_s))
        if span.kind in ("F", "B"):
            labels.append((span.start_s, span.end_s, row, str(span.group)))
    end = result.step_time_s or 1.0
    num_rows = len(row_of)
    ax.barh(range(num_rows), end, height=0.84, left=0.0, color=IDLE_COLOR)
    for (row, kind), ranges in boxes.items():
        ax.broken_barh(ranges, (row - 0.42, 0.84), facecolors=COLORS[kind], edgecolors="white", linewidths=0.3)
    for k in range(1, len(shown)):
        ax.axhline(k * pp - 0.5, color="#555555", linewidth=0.8)
    ax.set_xlim(*(time_range or (0.0, end)))
    ax.set_ylim(num_rows - 0.5, -0.5)
    ax.set_yticks(range(num_rows), [f"p{p} s{s}" for p in shown for s in range(pp)],
                  fontsize=7 if num_rows > 16 else 9)
    ax.set_xlabel("time (s)")
    ax.tick_params(axis="y", length=0)
    extra = f" (pipelines {shown[0]}-{shown[-1]} of {len(pipelines)})" if len(shown) < len(pipelines) else ""
    ax.set_title(title if title is not None else _title(result, extra))
    handles = [Patch(facecolor=COLORS[k], label=LEGEND[k]) for k in COLORS]
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    _label_boxes(ax, labels, num_rows)  # last: the title and legend take space from the axes


def _label_boxes(ax: Axes, labels: list[tuple[float, float, int, str]], num_rows: int) -> None:
    """Write group numbers where they fit: measured in pixels of the axes as laid out now."""
    ax.figure.draw_without_rendering()  # run the layout engine so the axes has its final size
    box = ax.get_window_extent()
    pixels_per_point = ax.figure.dpi / 72.0
    if box.height / num_rows < 1.3 * LABEL_POINTS * pixels_per_point:
        return  # rows too thin for any text
    left, right = ax.get_xlim()
    pixels_per_s = box.width / (right - left)
    char_px = CHAR_WIDTH * LABEL_POINTS * pixels_per_point
    for start, stop, row, text in labels:
        if (stop - start) * pixels_per_s >= len(text) * char_px + 3:
            ax.text((start + stop) / 2, row, text, ha="center", va="center", fontsize=LABEL_POINTS,
                    color="white", clip_on=True, in_layout=False)


def gantt(result: SimResult, path: str | Path, max_pipelines: int = 8) -> None:
    """Write the Gantt chart of the first ``max_pipelines`` pipelines to ``path`` (PNG, SVG, PDF)."""
    pp = 1 + max((span.stage for span in result.spans), default=0)
    rows = min(max_pipelines, len({span.pipeline for span in result.spans})) * pp
    fig = Figure(figsize=(14.0, min(24.0, max(3.0, 1.2 + 0.24 * rows))), layout="constrained")
    draw_gantt(fig.add_subplot(), result, max_pipelines=max_pipelines)
    fig.savefig(output_path(path), dpi=DPI)


def _stage_envelope(memories: list[DeviceMemory], end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Common instants of the devices' step functions and the lowest and highest live bytes there."""
    grid = np.unique(np.concatenate([np.asarray(m.times_s) for m in memories] + [np.array([end])]))
    levels = np.stack([np.asarray(m.live_bytes)[np.searchsorted(m.times_s, grid, side="right") - 1]
                       for m in memories])
    return grid, levels.min(axis=0), levels.max(axis=0)


def draw_memory_timeline(ax: Axes, result: SimResult) -> None:
    """Live GiB per GPU over the step, one colour per stage, and the usable capacity. With several
    pipelines, a stage shows the highest of its devices as a line and the lowest-to-highest range as a
    band (hundreds of overlapping lines would hide each other)."""
    by_stage: dict[int, list[DeviceMemory]] = defaultdict(list)
    for memory in result.memory:
        by_stage[memory.stage].append(memory)
    cmap = colormaps["tab10"] if len(by_stage) <= 10 else colormaps["viridis"].resampled(len(by_stage))
    end = max([result.step_time_s, *(m.times_s[-1] for m in result.memory)])
    for stage, memories in sorted(by_stage.items()):
        grid, low, high = _stage_envelope(memories, end)
        color = cmap(stage)
        if len(memories) > 1:
            ax.fill_between(grid, low / GIB, high / GIB, step="post", color=color, alpha=0.25, linewidth=0)
        ax.step(grid, high / GIB, where="post", color=color, linewidth=0.9, label=f"stage {stage}")
    capacity = result.memory_capacity_bytes / GIB
    ax.axhline(capacity, color="#C0392B", linestyle="--", linewidth=1.2, label=f"usable capacity {capacity:.1f} GiB")
    peak = max(result.peak_memory_bytes, default=0.0) / GIB
    ax.set_xlim(0.0, end or 1.0)
    ax.set_ylim(0.0, 1.08 * max(capacity, peak))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("live memory per GPU (GiB)")
    verdict = " - OUT OF MEMORY" if result.oom else ""
    ax.set_title(f"{result.strategy}, step {result.step}: peak {peak:.1f} GiB of {capacity:.1f} GiB{verdict}")
    handles, _ = ax.get_legend_handles_labels()
    pipelines = len({m.pipeline for m in result.memory})
    if pipelines > 1:
        handles.append(Patch(facecolor="#999999", alpha=0.35,
                             label=f"lines: highest of {pipelines} pipelines\nbands: lowest to highest"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", linewidth=0.4, alpha=0.5)


def memory_timeline(result: SimResult, path: str | Path) -> None:
    """Write the memory timeline of every device to ``path`` (PNG, SVG, PDF)."""
    fig = Figure(figsize=(12.0, 5.0), layout="constrained")
    draw_memory_timeline(fig.add_subplot(), result)
    fig.savefig(output_path(path), dpi=DPI)
