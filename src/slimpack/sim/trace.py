"""A simulated step in the Trace Event Format, the JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing open.

One process per pipeline, one thread per stage; a complete event (``"ph": "X"``) per forward,
backward, gradient sync and optimizer step, and a counter (``"ph": "C"``) per device for its live
memory. The format counts time in microseconds.
Must not import torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slimpack.files import output_path
from slimpack.plan.types import Action
from slimpack.sim.result import SimResult, Span
from slimpack.units import GIB

US_PER_S = 1e6
CATEGORY = {"F": "forward", "B": "backward", "sync": "grad sync", "optim": "optimizer"}


def _name(span: Span) -> str:
    if span.kind in ("F", "B"):
        return str(Action(span.kind, span.group, span.chunk))  # type: ignore[arg-type]
    return CATEGORY[span.kind]


def _metadata(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """Process and thread names, sorted so that pipeline 0 stage 0 comes first."""
    events: list[dict[str, Any]] = []
    devices = sorted({(span.pipeline, span.stage) for span in spans})
    for pipeline in sorted({p for p, _ in devices}):
        events.append({"ph": "M", "pid": pipeline, "name": "process_name", "args": {"name": f"pipeline {pipeline}"}})
        events.append({"ph": "M", "pid": pipeline, "name": "process_sort_index", "args": {"sort_index": pipeline}})
    for pipeline, stage in devices:
        events.append({"ph": "M", "pid": pipeline, "tid": stage, "name": "thread_name",
                       "args": {"name": f"stage {stage}"}})
        events.append({"ph": "M", "pid": pipeline, "tid": stage, "name": "thread_sort_index",
                       "args": {"sort_index": stage}})
    return events


def _span_events(spans: Sequence[Span]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for span in spans:
        event: dict[str, Any] = {
            "ph": "X", "name": _name(span), "cat": CATEGORY[span.kind], "pid": span.pipeline,
            "tid": span.stage, "ts": span.start_s * US_PER_S, "dur": (span.end_s - span.start_s) * US_PER_S}
        if span.kind in ("F", "B"):
            event["args"] = {"group": span.group, "chunk": span.chunk, "tokens": span.tokens}
        events.append(event)
    return events


def spans_trace(spans: Sequence[Span], other: dict[str, Any] | None = None) -> dict[str, Any]:
    """A trace of measured spans (the runtime's real run) with the same events as a simulated one."""
    return {"traceEvents": _metadata(spans) + _span_events(spans), "displayTimeUnit": "ms",
            "otherData": other or {}}


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    events = _metadata(result.spans) + _span_events(result.spans)
    for memory in result.memory:
        # counters belong to a process; the stage in the name gives each device its own track
        name = f"memory stage {memory.stage}"
        events.extend({"ph": "C", "name": name, "pid": memory.pipeline, "ts": time * US_PER_S,
                       "args": {"GiB": live / GIB}}
                      for time, live in zip(memory.times_s, memory.live_bytes, strict=True))
    summary = {k: v for k, v in result.summary().items() if not isinstance(v, list)}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": summary}


def save_chrome_trace(result: SimResult, path: str | Path) -> None:
    output_path(path).write_text(json.dumps(chrome_trace(result), separators=(",", ":")) + "\n")
