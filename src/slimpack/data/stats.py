"""Summary statistics of a length distribution: the figures ``slimpack datasets`` prints.

Percentiles use numpy's default (linear interpolation between order statistics), so the median
of an even count is the midpoint of the two middle lengths. "Long" documents are those strictly
longer than :data:`LONG_DOC_TOKENS`; their share is of tokens, not of documents, because the
tokens (and, quadratically, the attention cost) are what a planner has to place.

Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimpack.config.base import ConfigBase

LONG_DOC_TOKENS = 32768
"""Threshold of ``share_tokens_over_32k``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetStats(ConfigBase):
    count: int
    """Number of documents."""
    total_tokens: int
    """Sum of all lengths."""
    mean: float
    """Mean length."""
    median: float
    """Median length (midpoint for an even count)."""
    p99: float
    """99th percentile of the lengths (linear interpolation)."""
    max: int
    """Longest document."""
    share_tokens_over_32k: float
    """Share of all tokens that sit in documents longer than 32768 tokens, in [0, 1]."""


def dataset_stats(lengths: np.ndarray) -> DatasetStats:
    """Statistics of a non-empty 1-D array of positive lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assert lengths.ndim == 1 and lengths.size > 0, "stats of an empty length array"
    total = int(lengths.sum())
    median, p99 = np.percentile(lengths, [50, 99])
    return DatasetStats(
        count=int(lengths.size),
        total_tokens=total,
        mean=total / lengths.size,
        median=float(median),
        p99=float(p99),
        max=int(lengths.max()),
        share_tokens_over_32k=int(lengths[lengths > LONG_DOC_TOKENS].sum()) / total,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCut(ConfigBase):
    """What fitting a dataset to a context length does to its documents (per epoch of the stream)."""

    max_context: int
    """The context length documents are fitted to."""
    num_docs: int
    """Documents in the dataset."""
    num_cut_docs: int
    """Documents longer than ``max_context``: cut into ``max_context``-token chunks (or dropped)."""
    num_extra_samples: int
    """Samples the cutting adds (chunks beyond each cut document's first)."""
    num_dropped_tokens: int
    """Tokens left out of training (only when long documents are dropped instead of cut)."""

    def describe(self) -> str:
        """One line for tables and logs."""
        fate = (f"dropped ({self.num_dropped_tokens:,} tokens not trained)" if self.num_dropped_tokens
                else f"cut into {self.max_context}-token chunks (+{self.num_extra_samples:,} samples, no token dropped)")
        return (f"{self.num_cut_docs:,} of {self.num_docs:,} documents longer than the {self.max_context}-token "
                f"context {fate}")


def context_cut(lengths: np.ndarray, max_context: int, *, drop_long: bool = False) -> ContextCut:
    """How many documents of ``lengths`` do not fit ``max_context``, and what fitting them costs."""
    lengths = np.asarray(lengths, dtype=np.int64)
    long = lengths[lengths > max_context]
    return ContextCut(max_context=max_context, num_docs=int(lengths.size), num_cut_docs=int(long.size),
                      num_extra_samples=0 if drop_long else int((-(-long // max_context) - 1).sum()),
                      num_dropped_tokens=int(long.sum()) if drop_long else 0)
