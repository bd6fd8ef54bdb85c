"""A candidate shape of a pipeline's SlimPack plan, and how candidates' scores rank.
Must not import torch.
"""

from __future__ import annotations

from typing import NamedTuple

ASYMMETRIC, BOUNDED, SYMMETRIC = "asymmetric", "bounded", "symmetric"
"""How backward groups are formed: balanced on backward cost (the paper's asymmetric partitioning);
balanced on backward + forward cost, which keeps them closer in tokens to the forward groups, so
fewer activations pile up while the forwards run ahead; or the forward groups themselves."""


class Shape(NamedTuple):
    """One candidate shape of a pipeline's plan."""

    num_groups: int
    backward: str = ASYMMETRIC
    """ASYMMETRIC, BOUNDED or SYMMETRIC backward groups."""
    slicing: bool = True
    """False keeps every sample whole (a baseline-like packing, scored like the rest)."""
    lookahead: int = 0
    head_weight: float = 0.0
    """1.0 balances groups on the last stage's cost (layers + LM head + loss) instead of a middle
    stage's: with a large vocabulary the last stage is the bottleneck and its per-token head work
    makes token-heavy groups its slowest."""


Score = tuple[bool, float, float]
"""(fits in memory, step time, peak memory) of a candidate."""


def rank(score: Score) -> tuple[bool, float]:
    """Sort key: fitting candidates first, fastest first; then the least memory."""
    fits_, time_s, peak = score
    return (not fits_, time_s if fits_ else peak)
