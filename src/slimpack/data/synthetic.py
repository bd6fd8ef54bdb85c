"""Seeded synthetic length distributions: a lognormal body with a Pareto tail.

Real corpora are long-tailed (see the bundled datasets): most documents sit around a median of a
few hundred to a few thousand tokens, and a small share follows a power law out to the context
cap. The generator mixes the two on purpose, so tests and demos can dial the tail up or down:

- ``round(count * (1 - tail_share))`` documents ~ LogNormal(ln(median), sigma);
- the rest ~ Pareto(tail_alpha) with scale ``median * exp(2 * sigma)`` (about the body's 98th
  percentile, so the tail takes over where the body thins out);
- both rounded to integers and clipped to ``[1, max_length]`` (as a corpus cut at a context cap
  would be), then the tail documents are scattered at random positions.

Same config (seed included) => identical array, on any platform numpy's ``default_rng`` supports.
Reachable by name through :func:`slimpack.data.load_dataset` as ``synthetic`` (defaults) or
``synthetic:count=1000,seed=3,tail_share=0.1`` (any fields of :class:`SyntheticConfig`).

Must not import torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from slimpack.config.base import ConfigBase, require
from slimpack.errors import UserError

SYNTHETIC_NAME = "synthetic"


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticConfig(ConfigBase):
    count: int = 100_000
    """Number of documents."""
    median: float = 1024.0
    """Median length of the lognormal body, in tokens."""
    sigma: float = 1.0
    """Standard deviation of ln(length) in the body."""
    tail_share: float = 0.02
    """Share of documents drawn from the Pareto tail (0 = no tail, 1 = tail only)."""
    tail_alpha: float = 1.1
    """Pareto shape of the tail; smaller is heavier (alpha <= 2: infinite variance)."""
    max_length: int = 131072
    """Longest document; longer draws are clipped to it."""
    seed: int = 0
    """Seed of numpy's ``default_rng``."""

    def __post_init__(self) -> None:
        require(_is_int(self.count) and self.count >= 1, f"count must be >= 1, got {self.count!r}")
        # numpy draws from infinite parameters without complaint; every draw would clip to max_length.
        require(1 <= self.median < np.inf, f"median must be a finite length >= 1 token, got {self.median!r}")
        require(0 <= self.sigma < np.inf, f"sigma must be finite and >= 0, got {self.sigma!r}")
        require(0 <= self.tail_share <= 1, f"tail_share must be in [0, 1], got {self.tail_share!r}")
        require(self.tail_alpha > 0, f"tail_alpha must be > 0, got {self.tail_alpha!r}")
        require(_is_int(self.max_length) and self.max_length >= 1,
                f"max_length must be a positive integer, got {self.max_length!r}")
        # default_rng refuses negative seeds with a bare ValueError.
        require(_is_int(self.seed) and self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def tail_scale(self) -> float:
        """Smallest value of the Pareto tail, in tokens."""
        return self.median * float(np.exp(2 * self.sigma))

    def describe(self) -> str:
        """A one-line provenance string."""
        return (f"synthetic: lognormal body (median {self.median:g}, sigma {self.sigma:g}) + "
                f"Pareto tail ({self.tail_share:.1%} of docs, alpha {self.tail_alpha:g}), "
                f"{self.count} docs, max {self.max_length}, seed {self.seed}")


def synthetic_lengths(config: SyntheticConfig | None = None) -> np.ndarray:
    """Draw ``config.count`` lengths (int64, >= 1, <= ``max_length``) deterministically."""
    config = config or SyntheticConfig()
    rng = np.random.default_rng(config.seed)
    num_tail = int(round(config.count * config.tail_share))
    body = rng.lognormal(mean=np.log(config.median), sigma=config.sigma, size=config.count - num_tail)
    # numpy's pareto() is the Lomax form (support from 0); +1 then scale gives the classical Pareto.
    tail = (rng.pareto(config.tail_alpha, size=num_tail) + 1.0) * config.tail_scale
    values = np.concatenate([body, tail])
    lengths = np.clip(np.rint(values), 1, config.max_length)
    return lengths.astype(np.int64)[rng.permutation(config.count)]


def parse_synthetic(spec: str) -> SyntheticConfig:
    """``synthetic`` or ``synthetic:key=value,...`` -> config; a bad key or value is a UserError."""
    head, _, params = spec.partition(":")
    if head != SYNTHETIC_NAME:
        raise UserError(f"{spec!r} is not a synthetic dataset spec (expected 'synthetic[:k=v,...]')")
    fields = {f.name: f for f in dataclasses.fields(SyntheticConfig)}
    kwargs: dict[str, int | float] = {}
    for item in filter(None, (part.strip() for part in params.split(","))):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise UserError(f"{spec!r}: bad parameter {item!r}; expected key=value with key in "
                            f"{sorted(fields)}")
        kind = int if fields[key].type in ("int", int) else float
        try:
            kwargs[key] = kind(text.strip())
        except ValueError:
            raise UserError(f"{spec!r}: {key} expects {kind.__name__}, got {text.strip()!r}") from None
    return SyntheticConfig(**kwargs)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
