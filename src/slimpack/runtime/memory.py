"""Counting the activation memory a stage keeps between a forward and its backward.

``ActivationTracker`` installs ``torch.autograd.graph.saved_tensors_hooks`` while a stage runs and
records every tensor autograd saves for backward, plus tensors registered explicitly (the executor's
K/V caches). Bytes are counted per underlying storage, once however many views or saves share it,
and for as long as something still holds it: a saved tensor stops counting when autograd frees it
(after its node's backward), a cache entry when it is released. Parameters are never counted.
This is the figure that ``CostModel.activation_bytes`` predicts (see docs/runtime.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from slimpack.runtime.tensor_parallel import local


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    tensor = local(tensor)  # a DTensor (tensor parallelism) counts its rank's shard
    inner = getattr(tensor, "elem", None)  # the result of a functional collective wraps its tensor
    if isinstance(inner, torch.Tensor):
        tensor = inner
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if storage.nbytes() == 0:
        return None
    return str(tensor.device), storage.data_ptr(), storage.nbytes()


class _Held:
    """What a saved-tensor hook stores instead of the tensor: it releases the count when autograd
    drops it."""

    __slots__ = ("tensor", "tracker", "key")

    def __init__(self, tensor: torch.Tensor, tracker: ActivationTracker, key: tuple[str, int, int]) -> None:
        self.tensor, self.tracker, self.key = tensor, tracker, key
        tracker._add(key, saved=1)

    def __del__(self) -> None:
        self.tracker._add(self.key, saved=-1)


class ActivationTracker:
    """Live and peak bytes of tensors saved for backward (and registered caches), per storage."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {key for t in exclude if (key := _storage_key(t)) is not None}
        self._counts: dict[tuple[str, int, int], list[int]] = {}  # key -> [saved refs, cache refs]
        self.current_bytes = 0
        self.peak_bytes = 0
        self.cache_only_bytes = 0
        """Bytes held by caches and by no saved tensor (0 when the caches alias saved K/V)."""

    def _add(self, key: tuple[str, int, int], *, saved: int = 0, cache: int = 0) -> None:
        counts = self._counts.get(key)
        before_live = counts is not None
        before_cache_only = before_live and counts[0] == 0
        if counts is None:
            counts = self._counts[key] = [0, 0]
        counts[0] += saved
        counts[1] += cache
        assert counts[0] >= 0 and counts[1] >= 0, (key, counts)
        live = counts[0] + counts[1] > 0
        nbytes = key[2]
        if not live:
            del self._counts[key]
        cache_only = live and counts[0] == 0
        self.current_bytes += nbytes * (live - before_live)
        self.cache_only_bytes += nbytes * (cache_only - before_cache_only)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def pack(self, tensor: torch.Tensor) -> Any:
        """Saved-tensor pack hook: counts ``tensor`` until autograd drops what this returns."""
        key = _storage_key(tensor)
        if key is None or key in self._excluded:
            return tensor
        return _Held(tensor, self, key)

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    @contextlib.contextmanager
    def recording(self) -> Iterator[ActivationTracker]:
        """Count what autograd saves inside this block."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield self

    def hold(self, tensor: torch.Tensor) -> tuple[str, int, int] | None:
        """Count ``tensor``'s storage as kept until ``release`` is called with the returned handle."""
        key = _storage_key(tensor)
        if key is not None and key not in self._excluded:
            self._add(key, cache=1)
            return key
        return None

    def release(self, handle: tuple[str, int, int] | None) -> None:
        if handle is not None:
            self._add(handle, cache=-1)

    def reset_peak(self) -> None:
        self.peak_bytes = self.current_bytes
