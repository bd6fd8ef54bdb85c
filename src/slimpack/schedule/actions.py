"""The vocabulary of schedules: an ``Action`` (forward or backward of a group on a model chunk) and an
``Order`` (per pipeline stage, the actions it runs in turn). Must not import torch."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Literal, NamedTuple

import numpy as np

from slimpack.errors import UserError


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


Order = tuple[tuple[Action, ...], ...]
"""Per pipeline stage (device), its actions in the order it runs them."""

SliceKey = tuple[int, int, int]
"""A slice as schedules see it, ``(sample_id, start, end)`` (``plan.types.Slice`` is one)."""


def slice_columns(slices: Iterable[SliceKey], count: int, dtype: type = np.int64) -> np.ndarray:
    """The sample ids, starts and ends of ``count`` slices as the three rows of an array, read in C:
    the planners and the simulator turn thousands of slices into cost-model arrays per pipeline."""
    return np.fromiter(chain.from_iterable(slices), dtype=dtype, count=3 * count).reshape(-1, 3).T
