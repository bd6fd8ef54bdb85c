"""Knobs of the planners (SlimPack and the baselines). Defaults are the tuned values."""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.config.base import ConfigBase, require


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig(ConfigBase):
    min_slice_tokens: int = 1024
    """Shortest slice SlimPack may cut (kernel efficiency); slice boundaries align to ``slice_align``."""
    slice_align: int = 128
    """Slice boundaries are multiples of this (the attention kernel's tile)."""
    milp_time_limit_s: float = 0.25
    """Wall-clock limit of the MILP refinement for a whole plan (shared by its solves); on time-out
    the best solution found so far, at worst the heuristic's, is kept."""
    use_slicing: bool = True
    """Ablation switch: cut long samples into slices."""
    use_asymmetric: bool = True
    """Ablation switch: regroup backward work balanced on backward cost."""
    use_dp_merge: bool = True
    """Ablation switch: run ultra-long outliers on merged replicas with context parallelism."""
    use_wide_merge: bool = True
    """Switch (beyond the paper; needs ``use_dp_merge``): where memory throttles SlimPack's plan,
    also plan the whole batch on replicas merged k at a time (``strategies.slimpack.merged``)."""
    use_milp: bool = False
    """Switch: refine the heuristic's groups with a MILP (HiGHS). Off by default: over the 200 cells
    of the stress sweep (seed 12, step 0) it changed 14 of 176 SlimPack plans, each faster by under
    0.3% but one by 1.3%, for 21% more planning time; and under its wall-clock limit a plan can
    depend on the machine's speed (the runtime turns it off: every rank must plan alike)."""
    use_cost_balance: bool = True
    """Ablation switch: phase 1 balances replicas on forward+backward cost (off: on tokens, as
    token-count packers do)."""
    use_lookahead: bool = True
    """Ablation switch (beyond the paper): try letting stages run forwards ahead of 1F1B."""

    def __post_init__(self) -> None:
        require(self.slice_align >= 1, f"slice_align must be >= 1, got {self.slice_align}")
        require(self.min_slice_tokens >= self.slice_align,
                f"min_slice_tokens ({self.min_slice_tokens}) must be >= slice_align ({self.slice_align})")
        require(self.milp_time_limit_s > 0, f"milp_time_limit_s must be > 0, got {self.milp_time_limit_s}")
