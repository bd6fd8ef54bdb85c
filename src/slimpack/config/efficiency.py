"""Parameters of the time model: how close to peak each kind of op runs, as a function of size.

An op of F FLOPs over n tokens takes ``F / (peak * e_max * n / (n + n_half)) + overhead``
(a saturating efficiency curve: small slices run below peak). Rewritten, time is linear in the
unknowns: ``F * a + (F / n) * b`` with ``a = 1/(peak*e_max)`` and ``b = n_half/(peak*e_max)``, which is
what calibration fits by least squares. Defaults are for Hopper-class GPUs with FlashAttention and
are replaced by ``slimpack calibrate`` measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.config.base import ConfigBase, require


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyConfig(ConfigBase):
    gemm_max: float = 0.75
    """Fraction of peak reached by large GEMMs (QKV, output, MLP, LM head)."""
    gemm_half_tokens: float = 256.0
    """Tokens in a call at which GEMMs reach half of ``gemm_max``."""
    attention_max: float = 0.55
    """Fraction of peak reached by large causal attention (FlashAttention-2 class kernels)."""
    attention_half_tokens: float = 512.0
    """Query tokens of one slice at which attention reaches half of ``attention_max``."""
    layer_overhead_s: float = 40e-6
    """Fixed time per layer per forward (kernel launches, norms, RoPE, elementwise work)."""

    def __post_init__(self) -> None:
        require(0 < self.gemm_max <= 1, f"gemm_max must be in (0, 1], got {self.gemm_max}")
        require(0 < self.attention_max <= 1, f"attention_max must be in (0, 1], got {self.attention_max}")
        require(self.gemm_half_tokens >= 0 and self.attention_half_tokens >= 0,
                "half-efficiency sizes must be >= 0")
        require(self.layer_overhead_s >= 0, f"layer_overhead_s must be >= 0, got {self.layer_overhead_s}")
