"""The Plan: which slices run together, in which order, on which pipeline. Frozen values only.

Semantics (DESIGN.md §3): a *slice* ``(sample_id, start, end)`` is the token range [start, end) of a
sample; its attention covers keys [0, end) of that sample. A *group* is an ordered tuple of slices
run as one unit on a stage. Each pipeline has forward groups and backward groups that partition the
same slices; ``order`` gives each stage's action sequence (``None``: the default schedule).
Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from slimpack.config import Config
from slimpack.errors import UserError


class Slice(NamedTuple):
    sample_id: int
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


Group = tuple[Slice, ...]


def segments(group: tuple[Slice, ...] | list[Slice]) -> list[tuple[int, int]]:
    """(tokens, prefix) of the attention segments a group runs: contiguous slices of one sample
    listed next to each other form one segment (one varlen entry, one kernel tile schedule)."""
    out: list[tuple[int, int]] = []
    last: Slice | None = None
    for s in group:
        if last is not None and s.sample_id == last.sample_id and s.start == last.end:
            tokens, prefix = out[-1]
            out[-1] = (tokens + s.end - s.start, prefix)
        else:
            out.append((s.end - s.start, s.start))
        last = s
    return out
Formation = Literal["slim", "mix", "pack"]


class Action(NamedTuple):
    """One unit of work on a stage: forward (``F``) or backward (``B``) of a group, on a model chunk
    (chunk > 0 only under interleaved 1F1B). Text form: ``F3``, ``B5``, ``F3.1`` (chunk 1)."""

    kind: Literal["F", "B"]
    group: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.group}" + (f".{self.chunk}" if self.chunk else "")

    @staticmethod
    def parse(text: str) -> Action:
        kind, rest = text[:1], text[1:]
        group_text, _, chunk_text = rest.partition(".")
        if kind not in ("F", "B") or not group_text.isdecimal() or (chunk_text and not chunk_text.isdecimal()):
            raise UserError(f"bad action {text!r}: expected F<group> or B<group>, optionally .<chunk>")
        return Action(kind, int(group_text), int(chunk_text) if chunk_text else 0)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    id: int
    """Unique within a plan (and across the steps of one run)."""
    length: int
    """Tokens."""
    arrival_step: int = 0
    """Step at which the sample entered the batch stream (for the delay of deferred samples)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    replicas: tuple[int, ...]
    """DP replica indices running this pipeline: one, or several merged into a CP group."""
    cp: int
    """Context-parallel degree of this pipeline (layout cp x number of merged replicas)."""
    forward: tuple[Group, ...]
    """Forward groups in execution order."""
    backward: tuple[Group, ...]
    """Backward groups in execution order (a partition of the same slices)."""
    order: tuple[tuple[Action, ...], ...] | None = None
    """Per stage, the action sequence; None means the default schedule for these groups."""
    formations: tuple[Formation, ...] | None = None
    """Per forward group, how it was formed (SlimPack reports slim/mix/pack)."""

    @property
    def symmetric(self) -> bool:
        return self.forward == self.backward


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    config: Config
    strategy: str
    step: int = 0
    samples: tuple[Sample, ...]
    deferred: tuple[int, ...] = ()
    """Ids of samples of this batch held back to a later step (they appear in no group)."""
    pipelines: tuple[PipelinePlan, ...]
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Planner diagnostics (time taken, solver status, chosen knobs); not needed to check or run."""

    def sample_lengths(self) -> dict[int, int]:
        return {s.id: s.length for s in self.samples}
