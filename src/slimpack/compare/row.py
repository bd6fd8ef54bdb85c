"""One strategy's figures over a comparison's measured window: a typed row, its JSON, and the
table columns that both the terminal table (``slimpack compare``) and the report render, so the two
always show the same figures. Must not import torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slimpack.strategies import CUTS_DOCUMENTS
from slimpack.units import GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyRow:
    """Figures over the measured window's steps that planned and simulated (docs/compare.md)."""

    strategy: str
    steps: int
    """Steps in the measured window."""
    failed_steps: tuple[int, ...]
    """Steps (warm-up, window or drain) on which planning or simulation raised."""
    errors: tuple[str, ...]
    """The distinct error messages of those steps."""
    tokens_per_s: float
    """Tokens trained in the window / the window's simulated time (0 when no step ran)."""
    window_tokens: int
    window_time_s: float
    speedup_vs_fixed: float | None
    step_time_mean_s: float | None
    step_time_p95_s: float | None
    ideal_time_mean_s: float | None
    efficiency: float | None
    """Σ ideal / Σ simulated step time over the window (one ideal for every strategy)."""
    extra_work_fraction: float | None
    """Σ the plan's own modelled work / Σ ideal − 1: what its grouping adds over whole documents."""
    schedule_efficiency: float | None
    """Σ own work / Σ step time: how well the schedule packs the plan's own work."""
    idle: dict[str, float] | None
    """Where idle device time went over the window (``sim.idle`` keys), weighted by step time."""
    bubble_fraction: float | None
    mfu: float | None
    peak_memory_bytes: float
    memory_capacity_bytes: float | None
    oom_steps: tuple[int, ...]
    """Steps whose peak exceeds usable memory, of every step that ran (warm-up, window and drain:
    a drain that cannot hold the work a strategy deferred to it counts)."""
    planner_time_p50_s: float | None
    mean_delay_steps_per_token: float
    held_after_window_tokens: int
    """Tokens the strategy still held back at the window's end (carried, not drained into it)."""
    pieces_cut_off: int
    """Pieces the strategy cut off documents at sequence boundaries over the window (0 where every
    document fits its sequence, as in a corpus already chunked to the context)."""
    drain_steps: int
    """Steps with no new samples run after the window to train what was held (not in the window)."""
    drain_time_s: float
    drain_tokens: int
    held_after_drain_tokens: int
    """Tokens still held when the drain stopped (0 unless it hit its step limit or failed)."""

    @property
    def ran(self) -> bool:
        return self.efficiency is not None

    @property
    def tokens_per_s_with_drain(self) -> float:
        """Throughput over the window and the drain after it: every token the window's batches
        brought, for a strategy that holds work back past the window (used where a bound on the
        whole batch's time must hold, e.g. ``tune``)."""
        time_s = self.window_time_s + self.drain_time_s
        return (self.window_tokens + self.drain_tokens) / time_s if time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {key: list(value) if isinstance(value, tuple) else value for key, value in data.items()}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(value * scale, spec)


COLUMNS: tuple[tuple[str, Callable[[StrategyRow], str]], ...] = (
    ("strategy", lambda r: r.strategy),
    ("tokens/s", lambda r: f"{r.tokens_per_s:,.0f}"),
    ("step mean (s)", lambda r: _fmt(r.step_time_mean_s, ".2f")),
    ("step p95 (s)", lambda r: _fmt(r.step_time_p95_s, ".2f")),
    ("vs fixed", lambda r: _fmt(r.speedup_vs_fixed, ".2f") + "x"),
    ("efficiency", lambda r: _fmt(r.efficiency, ".3f")),
    ("MFU", lambda r: _fmt(r.mfu, ".1f", 100) + "%"),
    ("extra work", lambda r: "+" + _fmt(r.extra_work_fraction, ".1f", 100) + "%"),
    ("bubble", lambda r: _fmt(r.bubble_fraction, ".1f", 100) + "%"),
    ("peak mem / cap (GiB)", lambda r: f"{r.peak_memory_bytes / GIB:.1f} / {(r.memory_capacity_bytes or 0) / GIB:.1f}"),
    ("OOM steps", lambda r: str(len(r.oom_steps))),
    ("plan p50 (s)", lambda r: _fmt(r.planner_time_p50_s, ".2f")),
    ("delay (steps/token)", lambda r: f"{r.mean_delay_steps_per_token:.2f}"),
)
"""(header, cell) of every table column, in order."""


def cells(row: StrategyRow) -> list[str]:
    """The row as table cells; a strategy that never ran says so in its second cell."""
    if not row.ran:
        return [row.strategy, "failed"] + [""] * (len(COLUMNS) - 2)
    return [cell(row) for _, cell in COLUMNS]


def drain_notes(rows: Sequence[StrategyRow]) -> list[str]:
    """One sentence per strategy that held work back at the window's end: its drain, reported apart."""
    notes = []
    for r in rows:
        if r.held_after_window_tokens:
            notes.append(f"{r.strategy} held {r.held_after_window_tokens:,} tokens at the window's end; draining "
                         f"them took {r.drain_steps} more step(s), {r.drain_time_s:.2f} s for "
                         f"{r.drain_tokens:,} tokens (not in the window's figures)"
                         + (f"; {r.held_after_drain_tokens:,} tokens still held" if r.held_after_drain_tokens else ""))
    return notes


def cut_document_notes(rows: Sequence[StrategyRow]) -> list[str]:
    """A sentence on the strategies that ran and cut documents (``CUTS_DOCUMENTS``, where they did
    cut some: ``pieces_cut_off``): their tokens/s is for less work than whole documents need, so a
    lead of theirs is not for the same training. Their modelled work is set against SlimPack's where
    it ran on the same tokens."""
    cutting = [r for r in rows if r.strategy in CUTS_DOCUMENTS and r.extra_work_fraction is not None
               and r.pieces_cut_off]
    if not cutting:
        return []
    names = " and ".join(r.strategy for r in cutting)
    pieces = " and ".join(f"{r.pieces_cut_off:,}" for r in cutting)
    note = (f"{names} {'cuts' if len(cutting) == 1 else 'cut'} documents at sequence boundaries ({pieces} "
            f"piece{'s' if len(cutting) > 1 or cutting[0].pieces_cut_off > 1 else ''} cut off over the window; a "
            "piece cut off does not attend to its document's earlier tokens), so fewer attention pairs are "
            "trained than in unpacked training on the same tokens")
    ours = next((r for r in rows if r.strategy == "slimpack" and r.extra_work_fraction is not None), None)
    if ours is not None and all(r.window_tokens == ours.window_tokens for r in cutting):
        # the same tokens have the same ideal work, so own work compares as (1 + extra work)
        note += "; modelled work on the same tokens against slimpack's: " + ", ".join(
            f"{r.strategy} {(1 + r.extra_work_fraction) / (1 + ours.extra_work_fraction) - 1:+.1%}"  # type: ignore[operator]
            for r in cutting)
    return [note]
