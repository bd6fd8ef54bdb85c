"""Charts of a comparison (matplotlib, Agg): throughput, per-group forward/backward time spread, and
peak memory per stage (single steps: ``step_charts``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from slimpack.compare.row import StrategyRow  # noqa: E402
from slimpack.compare.run import StrategyRun  # noqa: E402
from slimpack.units import GIB  # noqa: E402


def throughput_chart(rows: Sequence[StrategyRow], path: Path) -> None:
    names = [r.strategy for r in rows]
    values = [r.tokens_per_s / 1e3 for r in rows]
    best = max(values, default=0)
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 2), 3.6))
    bars = ax.bar(names, values, color=["#2a9d8f" if v == best else "#8d99ae" for v in values])
    for bar, row in zip(bars, rows, strict=True):
        label = "failed" if not row.tokens_per_s else (
            f"{row.speedup_vs_fixed:.2f}x" if row.speedup_vs_fixed else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=9, xytext=(0, 2), textcoords="offset points")
    ax.set_ylabel("thousand tokens / s")
    ax.set_title("Simulated throughput (label: speed-up over fixed)")
    ax.set_ylim(0, best * 1.15 if best else 1)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def group_time_chart(runs: Sequence[StrategyRun], path: Path) -> None:
    data, labels = [], []
    for run in runs:
        rec = run.representative()
        if rec is None or rec.result is None:
            continue
        forward = [t * 1e3 for pipe in rec.result.forward_group_times_s for t in pipe]
        backward = [t * 1e3 for pipe in rec.result.backward_group_times_s for t in pipe]
        data += [forward, backward]
        labels += [f"{run.name}\nforward", f"{run.name}\nbackward"]
    if not data:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(data) + 1), 4))
    box = ax.boxplot(data, patch_artist=True, showfliers=True)
    for k, patch in enumerate(box["boxes"]):
        patch.set_facecolor("#a8dadc" if k % 2 == 0 else "#f4a261")
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("group time on a middle stage (ms)")
    ax.set_title("Per-group forward and backward time (median step): a tight box is a balanced plan")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def memory_chart(runs: Sequence[StrategyRun], path: Path) -> None:
    peaks = []
    for run in runs:
        ok = run.ok_steps
        if ok:
            stages = len(ok[0].result.peak_memory_bytes)  # type: ignore[union-attr]
            peaks.append((run.name, [max(s.result.peak_memory_bytes[k] for s in ok) / GIB  # type: ignore[union-attr]
                                     for k in range(stages)], ok[0].result.memory_capacity_bytes / GIB))  # type: ignore[union-attr]
    if not peaks:
        return
    stages = len(peaks[0][1])
    width = 0.8 / len(peaks)
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * stages + 3), 4.2))
    for k, (name, values, _) in enumerate(peaks):
        ax.bar([s + k * width - 0.4 + width / 2 for s in range(stages)], values, width, label=name)
    ax.axhline(peaks[0][2], color="#d62828", linestyle="--", linewidth=1, label="usable memory")
    ax.set_xticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.set_ylabel("peak memory per GPU (GiB)")
    ax.set_title("Peak memory per pipeline stage (max over replicas and steps)")
    ax.legend(fontsize=8, ncol=min(8, len(peaks) + 1), loc="upper center", bbox_to_anchor=(0.5, -0.1),
              frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
