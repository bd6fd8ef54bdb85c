"""Where a simulated step's idle device time goes.

Over the compute part of a step (from 0 to the end of the last backward), every device of every
pipeline is either busy or idle. The idle time is split four ways:

- **fill/drain**: the bubble a perfectly balanced pipeline with the same work and number of groups
  would have: (pp - 1) / (groups x virtual stages) of a device's busy time (Narayanan et al., SC'21,
  §2.2), at most the device's idle time in its pipeline;
- **replica wait**: after its pipeline's last backward until the slowest pipeline's (imbalance
  between data-parallel replicas: the gradient all-reduce waits for the slowest);
- **throttled**: of the rest, gaps during which a forward this device runs later already had its
  input (the schedule held it back to bound the activations in flight: memory);
- **imbalance**: the remainder (waiting on other stages' unequal work).

Fractions are of the total device time (devices x compute end), weighted by the replicas a merged
pipeline occupies. Must not import torch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from slimpack.sim.result import SimResult, Span


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleSplit:
    fill_drain: float
    replica_wait: float
    throttled: float
    imbalance: float

    @property
    def total(self) -> float:
        return self.fill_drain + self.replica_wait + self.throttled + self.imbalance

    def to_dict(self) -> dict[str, float]:
        return {"fill_drain": self.fill_drain, "replica_wait": self.replica_wait,
                "throttled": self.throttled, "imbalance": self.imbalance}


def _input_ready(span: Span, forward_end: dict[tuple[int, int, int, int], float], pp: int) -> float:
    """When a forward's input was there: the previous model chunk's forward of the same group ended
    (P2P time not counted); a first chunk's input is always there."""
    if span.stage > 0:
        return forward_end[(span.pipeline, span.stage - 1, span.group, span.chunk)]
    if span.chunk > 0:
        return forward_end[(span.pipeline, pp - 1, span.group, span.chunk - 1)]
    return 0.0


def _throttled(spans: list[Span], forward_end: dict[tuple[int, int, int, int], float], pp: int) -> float:
    """Gap time on one device (spans sorted by start) while its next forward's input was there."""
    forwards = [s for s in spans if s.kind == "F"]
    total, k = 0.0, 0
    for before, after in zip(spans, spans[1:], strict=False):
        if after.start_s <= before.end_s:
            continue
        while k < len(forwards) and forwards[k].start_s < after.start_s:
            k += 1
        if k < len(forwards):
            ready = _input_ready(forwards[k], forward_end, pp)
            total += max(0.0, after.start_s - max(before.end_s, ready))
    return total


def idle_split(result: SimResult, widths: dict[int, int] | None = None) -> IdleSplit:
    """The idle classes of ``result`` as fractions of device time. ``widths``: replicas per pipeline
    (merged DP-Merge pipelines count as that many), default 1 each."""
    return split_spans(result.spans, len(result.peak_memory_bytes), widths or {})


def split_spans(spans: tuple[Span, ...] | list[Span], pp: int, widths: dict[int, int]) -> IdleSplit:
    actions = [s for s in spans if s.kind in ("F", "B")]
    totals = dict.fromkeys(("fill_drain", "replica_wait", "throttled", "imbalance"), 0.0)
    if not actions:
        return IdleSplit(**totals)
    compute_end = max(s.end_s for s in actions)
    forward_end = {(s.pipeline, s.stage, s.group, s.chunk): s.end_s for s in actions if s.kind == "F"}
    by_pipeline: dict[int, dict[int, list[Span]]] = defaultdict(lambda: defaultdict(list))
    for s in actions:
        by_pipeline[s.pipeline][s.stage].append(s)
    device_time = 0.0
    for pipeline, devices in by_pipeline.items():
        weight = widths.get(pipeline, 1)
        own_end = max(s.end_s for spans_of in devices.values() for s in spans_of)
        groups = len({(s.group, s.chunk) for s in devices[0] if s.kind == "F"}) if 0 in devices else 1
        for device_spans in devices.values():
            device_spans.sort(key=lambda s: s.start_s)
            busy = sum(s.end_s - s.start_s for s in device_spans)
            idle = own_end - busy
            fill_drain = min(idle, busy * (pp - 1) / max(groups, 1))
            excess = idle - fill_drain
            throttled = min(excess, _throttled(device_spans, forward_end, pp))
            totals["fill_drain"] += weight * fill_drain
            totals["throttled"] += weight * throttled
            totals["imbalance"] += weight * (excess - throttled)
            totals["replica_wait"] += weight * (compute_end - own_end)
        device_time += weight * compute_end * len(devices)
    return IdleSplit(**{k: v / device_time for k, v in totals.items()})
